"""Replay: reconstruction rules on small hand-made tables, and a round trip through the engine."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from shared_traces import real

from ovsim.engine.machine import build_machine
from ovsim.engine.sim import Engine
from ovsim.errors import OvsimError
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import load_gpu, load_system
from ovsim.models import cost, occupancy
from ovsim.models.ir import Op, StreamSpec, Workload
from ovsim.models.op_prices import collective_parts
from ovsim.models.workload import CollectiveOpSpec, Knobs
from ovsim.replay import _collective_groups, _dependencies, replay
from ovsim.replay_kernels import KernelColumns, isolated_durations, overlap_flags
from ovsim.replay_score import comm_summary, summarize
from ovsim.traces.load import load_trace
from ovsim.traces.table import TraceBundle, make_table

GPU = "h100-sxm5-80gb"
# NCCL's design: a collective holds every block of its grid while it runs (the engine's rule), and
# no memory contention beyond that: the tables these tests replay record no protocol and no bytes,
# which the shipped H100 pressure and GEMM traffic (fitted on the harness's kernels) would price.
ALL_BLOCKS = {"replay_collective_sm_fraction": 1.0, "nccl_memory_pressure": {"default": 0.0},
              "replay_hbm_fraction": {"gemm": 0.0}}


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    cols: dict[str, list[Any]] = {}
    keys = sorted({k for r in rows for k in r})
    for k in keys:
        cols[k] = [r.get(k) for r in rows]
    return make_table(cols)


def k(name: str, start_us: float, dur_us: float, *, stream: int = 7, rank: int = 0, kind: str = "",
      **extra: Any) -> dict[str, Any]:
    return {"rank": rank, "stream": stream, "name": name, "kind": kind, "start_s": start_us * 1e-6,
            "duration_s": dur_us * 1e-6, "grid_x": 132, "grid_y": 1, "grid_z": 1, "block_x": 256, "block_y": 1,
            "block_z": 1, "registers_per_thread": 128, "shared_mem_bytes": 0, **extra}


def test_overlap_flags_mark_compute_kernels_that_intersect_a_collective() -> None:
    df = table([k("gemm_a", 0, 10), k("nccl", 5, 10, stream=9, kind="collective"), k("gemm_b", 20, 5),
                k("gemm_c", 14.9, 1)])
    assert overlap_flags(KernelColumns.of(df)).tolist() == [True, False, False, True]


def test_isolated_duration_comes_from_clean_instances_never_from_itself() -> None:
    df = table([k("gemm", 0, 10), k("gemm", 20, 12), k("nccl", 25, 30, stream=9, kind="collective"),
                k("gemm", 60, 11), k("other", 26, 4)])
    c = KernelColumns.of(df)
    iso, src = isolated_durations(c, overlap_flags(c))
    # The overlapped GEMM takes the median of the two clean ones; the other kernel has no clean twin.
    assert src.tolist() == ["self", "signature", "measured", "self", "none"]
    assert iso[1] == pytest.approx(10.5e-6)
    assert iso[4] == pytest.approx(4e-6)  # runs at its measured time, but is not scored


def test_a_kernel_queued_behind_another_stream_depends_on_it() -> None:
    # b on stream 8 starts 1 us after a (stream 7) ends, its own stream idle since 0: it waited for a.
    # c starts 2 us after a ends too, but its own stream was busy until after a ended: no wait on a.
    df = table([k("a", 0, 10), k("b", 11, 5, stream=8), k("x", 0, 11.5, stream=9), k("c", 12, 5, stream=9)])
    deps = _dependencies(KernelColumns.of(df), None)
    assert deps == {1: [0]}


def test_a_kernel_launched_after_the_other_ended_waited_for_the_host_instead() -> None:
    df = table([k("a", 0, 10), k("b", 11, 5, stream=8, launch_s=10.5e-6)])
    assert _dependencies(KernelColumns.of(df), None) == {}


def test_collectives_match_by_sequence_number_or_by_order() -> None:
    by_seq = table([k("nccl", 0, 5, kind="collective", seq=4, process_group="0"),
                    k("nccl", 1, 5, rank=1, kind="collective", seq=4, process_group="0")])
    assert set(_collective_groups(KernelColumns.of(by_seq)).values()) == {"pg0:seq4"}
    uneven = table([k("nccl", 0, 5, kind="collective"), k("nccl", 10, 5, kind="collective"),
                    k("nccl", 1, 5, rank=1, kind="collective")])
    with pytest.raises(OvsimError, match="different numbers of collectives"):
        _collective_groups(KernelColumns.of(uneven))


# -- round trip ---------------------------------------------------------------------------------------


def _simulated_run() -> pd.DataFrame:
    """Two H100 ranks, each a compute stream of 4096^3 GEMMs and a comm stream with two 256 MB
    all-reduces launched beside GEMMs 3 and 6: simulated with the full model, it stands in for a
    measurement whose ground truth is known."""
    gpu = load_gpu(GPU)
    system = load_system("hgx-h100")
    params = load_calibration(gpu, GPU).params
    gemm = cost.gemm(4096, 4096, 4096, "bf16", gpu, params)
    spec = CollectiveOpSpec(name="ar", kind="all_reduce", size_bytes=256 * 2**20)
    ops: list[Op] = []
    for r in range(2):
        for i in range(9):
            ops.append(Op(f"g{i}@{r}", "gemm_4096", "gemm", r, "compute", kernel=gemm, delay_s=2e-6))
        for j, after in enumerate((2, 5)):
            kernel, flow, _ = collective_parts(spec, f"ar{j}", [0, 1], gpu, system, params, Knobs())[0]
            ops.append(Op(f"ar{j}@{r}", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "collective", r, "comm",
                          deps=(f"g{after}@{r}",), kernel=kernel, flow=flow))
    wl = Workload(ops=tuple(ops), streams=tuple(StreamSpec(r, s) for r in range(2) for s in ("compute", "comm")),
                  n_ranks=2)
    tl = Engine(wl, build_machine(system, gpu, params, n_ranks=2)).run().ops
    tl = tl[tl["rank"] >= 0].reset_index(drop=True)
    by_id = {op.id: op for op in ops}
    rows = []
    for rec in tl.itertuples(index=False):
        op = by_id[str(rec.id)]
        assert op.kernel is not None
        coll = op.kind == "collective"
        rows.append({"rank": rec.rank, "stream": 7 if op.stream == "compute" else 9, "name": op.name,
                     "kind": "collective" if coll else "gemm", "start_s": rec.start_s, "duration_s": rec.duration_s,
                     "grid_x": op.kernel.blocks, "grid_y": 1, "grid_z": 1, "block_x": op.kernel.block.threads,
                     "block_y": 1, "block_z": 1, "registers_per_thread": op.kernel.block.registers_per_thread,
                     "shared_mem_bytes": op.kernel.block.shared_mem_bytes,
                     "collective": "all_reduce" if coll else "", "message_bytes": 256 * 2**20 if coll else np.nan,
                     "group_size": 2 if coll else None, "seq": int(str(rec.id)[2]) if coll else None,
                     "process_group": "0" if coll else ""})
    return table(rows)


def test_replaying_a_simulated_run_beats_the_naive_prediction() -> None:
    """Self-consistency, not validation: the 'measurement' is the engine's own, so replay must
    recover the contention it put there from the table alone. The engine held every NCCL block for
    the whole collective, so the replay must too (the shipped replay fraction is fitted on real runs)."""
    df = _simulated_run()
    res = replay(TraceBundle(kernels=df, gpu_names={0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA H100 80GB HBM3"}),
                 overrides=ALL_BLOCKS)
    s = res.summary
    assert s["overlapped_compute_kernels"] > 0 and s["scored_kernels"] == s["overlapped_compute_kernels"]
    # The GEMMs beside the all-reduce lose SMs to NCCL's blocks: the naive prediction misses that.
    assert s["naive_mape_pct"] > 5
    assert s["mape_pct"] < s["naive_mape_pct"] / 2
    assert abs(s["span_error_pct"]) < 5
    clean = res.kernels[~res.kernels["overlapped"] & (res.kernels["kind"] == "gemm")]
    np.testing.assert_allclose(clean["predicted_duration_s"], clean["measured_duration_s"], rtol=0.02)


def test_collectives_hold_the_fitted_share_of_their_grid() -> None:
    """With no blocks held the GEMMs beside the all-reduce keep every SM: the replay predicts them
    at their isolated time, as the naive prediction does."""
    bundle = TraceBundle(kernels=_simulated_run(), gpu_names={0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA H100 80GB HBM3"})
    none = replay(bundle, counters=False, overrides={**ALL_BLOCKS, "replay_collective_sm_fraction": 0.0})
    coll = [op for op in none.workload.ops if op.kind == "collective"]
    assert coll and all(op.kernel is None for op in coll)
    assert none.summary["mape_pct"] == pytest.approx(none.summary["naive_mape_pct"], abs=0.5)
    half = replay(bundle, counters=False, overrides={**ALL_BLOCKS, "replay_collective_sm_fraction": 0.5})
    grid = int(_simulated_run().query("kind == 'collective'")["grid_x"].iloc[0])
    assert {op.kernel.blocks for op in half.workload.ops if op.kind == "collective" and op.kernel} == {
        math.ceil(grid / 2)}


NVJET = "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT"
# cuBLAS's persistent launch on an H100: one 384-thread block per SM (as the harness recorded it).
PERSISTENT = {"grid_x": 2, "grid_y": 66, "block_x": 384, "registers_per_thread": 168, "shared_mem_bytes": 188_636}


def _beside_channels(name: str, host_op: str, **launch: Any) -> pd.DataFrame:
    """Three GEMMs alone (1 ms each), then three beside a 16-channel collective with NCCL's block."""
    gemms = [k(name, 2000 * i, 1000, kind="gemm", host_op=host_op, **launch) for i in range(3)]
    chan = k("ovsim_channel_copy", 6000, 20_000, stream=13, kind="collective", grid_x=16, block_x=640,
             registers_per_thread=96, shared_mem_bytes=82_240)
    later = [k(name, 6100 + 3000 * i, 1300, kind="gemm", host_op=host_op, **launch) for i in range(3)]
    return table([*gemms, chan, *later])


def test_a_persistent_gemm_beside_held_sms_takes_the_rounds_of_tiles_its_resident_blocks_need() -> None:
    """An 8192^3 GEMM on 320x128 tiles has 26 x 64 = 1664 tiles: ceil(1664/132) = 13 rounds on every
    SM. 16 SMs held by channel blocks launched on the idle GPU (which leave no room for its block)
    strand 8 more for its 2-CTA clusters (one in each GPC, GpuModel.stranded_sms), so 24 of its 132
    CTAs find no SM: the other 108 run the other 1640 tiles in ceil(1640/108) = 16 rounds, then the
    24 run their first tiles: 17 rounds for 13, x17/13 with every tile at one pace; as 132 blocks it
    would be two waves (x2). A tile runs faster on fewer busy SMs (gemm_load_share s, in units of a
    full round: 1 - s * idle SMs / 132): alone 12 full rounds and one of 80 tiles, 13 - 52s/132;
    beside, 15 rounds on 108 SMs, one of 20 tiles, then the 24 late ones, 17 - 580s/132. The
    harness measured x1.27 beside 16 copy channels and x1.22 beside 16 SMs held without traffic
    (calibration/data/README.md)."""
    host_op = "aten::mm[[8192, 8192], [8192, 8192]]"
    out = replay(TraceBundle(kernels=_beside_channels(NVJET, host_op, **PERSISTENT)), gpu=GPU, counters=False,
                 overrides=ALL_BLOCKS).kernels
    beside = out[out["overlapped"] & (out["kind"] == "gemm")]
    assert len(beside) == 3
    s = load_calibration(load_gpu(GPU), GPU).params.gemm_load_share
    np.testing.assert_allclose(beside["predicted_duration_s"] / beside["isolated_s"],
                               (17 - 580 * s / 132) / (13 - 52 * s / 132), rtol=1e-6)
    alone = out[~out["overlapped"] & (out["kind"] == "gemm")].iloc[:3]
    np.testing.assert_allclose(alone["predicted_duration_s"], alone["measured_duration_s"], rtol=1e-9)


@pytest.mark.parametrize(("what", "waves", "alone"), [("no shapes", 2, 1), ("no tile in the name", 2, 1),
                                                      ("more than one wave", 3, 2)])
def test_a_gemm_not_known_to_be_persistent_keeps_its_blocks(what: str, waves: int, alone: int) -> None:
    """Without the problem's shapes or the kernel's tile, or with a grid of more than one wave, the
    blocks are the work: with 16 of 132 SMs held and 8 more stranded for its 2-block clusters, 132
    blocks take two waves instead of one, and 264 blocks ceil(264/108) = 3 instead of 2. Their
    tiles on 108 SMs, then on the rest of the blocks' SMs, run 1 - s * idle / 132 of a full wave
    (gemm_load_share s): waves - s in all (108 + 24, 108 + 108 + 48 blocks)."""
    name, host_op, launch = NVJET, "aten::mm[[8192, 8192], [8192, 8192]]", dict(PERSISTENT)
    if what == "no shapes":
        host_op = "aten::mm"
    elif what == "no tile in the name":
        name = "nvjet_sm90_persistent_kernel"
    else:
        launch["grid_x"] = 4
    out = replay(TraceBundle(kernels=_beside_channels(name, host_op, **launch)), gpu=GPU, counters=False,
                 overrides=ALL_BLOCKS).kernels
    beside = out[out["overlapped"] & (out["kind"] == "gemm")]
    s = load_calibration(load_gpu(GPU), GPU).params.gemm_load_share
    np.testing.assert_allclose(beside["predicted_duration_s"] / beside["isolated_s"], (waves - s) / alone, rtol=1e-6)


def test_replay_needs_a_known_gpu() -> None:
    df = table([k("gemm", 0, 10)])
    with pytest.raises(OvsimError, match="--gpu"):
        replay(TraceBundle(kernels=df, gpu_names={0: "Imaginary GPU 9000"}))
    assert replay(TraceBundle(kernels=df), gpu=GPU).summary["kernels"] == 1


@pytest.mark.parametrize("far_us", [2e12, -2e12, 1e300])
def test_a_timestamp_far_from_the_rest_is_refused(far_us: float) -> None:
    """Kernels weeks or ages apart are a corrupt timestamp or files on two clocks: replaying them
    would simulate (or hang on) a run no profiler recorded."""
    df = table([k("gemm", 0, 10), k("add", 20, 5), k("late", far_us, 5)])
    bundle = TraceBundle(kernels=df, sources={0: "run.json"})
    with pytest.raises(OvsimError) as err:
        replay(bundle, gpu=GPU)
    assert (err.value.source, err.value.field) == ("run.json", "start_s")
    assert "activities span" in err.value.message and "different clocks" in err.value.message


def test_a_launch_this_gpu_cannot_hold_still_replays() -> None:
    """Registers past the per-thread limit, or more than an SM holds for the block: the kernel runs
    at its measured duration with what fits, instead of stopping the replay."""
    df = table([k("gemm", 0, 10, registers_per_thread=100_000), k("add", 20, 5, block_x=1024,
                                                                  registers_per_thread=255)])
    out = replay(TraceBundle(kernels=df), gpu=GPU).kernels
    np.testing.assert_allclose(out["predicted_duration_s"], out["measured_duration_s"], rtol=1e-9)




@pytest.mark.parametrize("rel", ["param/et_replay/tests/inputs/dlrm_kineto.tar.gz",
                                 "HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz"])
def test_replayed_span_of_a_real_run_is_within_5_percent(rel: str) -> None:
    """The measured span is the reference (ovsim's target: span error at most 5%)."""
    path = real(rel)
    res = replay(load_trace(path), counters=False)
    assert abs(res.summary["span_error_pct"]) <= 5.0
    k = res.kernels
    # No overlapped kernel's isolated duration is its own measurement.
    assert not (k["overlapped"] & (k["isolated_source"] == "self")).any()
    assert res.summary["scored_kernels"] > 0


# -- communication under compute, weighted error, rank numbers ------------------------------------------

# No contention at all: the replay moves a kernel only by its isolated duration.
NO_CONTENTION = {**ALL_BLOCKS, "replay_collective_sm_fraction": 0.0}


def _comm_trace() -> pd.DataFrame:
    """Rank 3 alone: a GEMM [0, 15) us beside an all-reduce [5, 25), its clean twin [50, 60) (10 us
    alone), and a device copy [45, 65) over the twin."""
    return table([k("gemm", 0, 15, rank=3), k("gemm", 50, 10, rank=3),
                  k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5, 20, stream=9, rank=3),
                  k("Memcpy DtoD (Device -> Device)", 45, 20, stream=11, rank=3)])


def test_exposed_and_hidden_communication_measured_and_predicted() -> None:
    """Measured: 10 us of the all-reduce's 20 under compute ([5, 15)): 50% hidden, 10 us exposed.
    Predicted: the first GEMM runs at its twin's 10 us, [0, 10), so 5 us hidden (25%), 15 exposed;
    the twin, 35 us after it as measured, runs [45, 55), still under the copy. The copy is neither
    (HTA): counted as communication it would add 20 us, 10 hidden (37.5%, 25 us exposed)."""
    s = replay(TraceBundle(kernels=_comm_trace()), gpu=GPU, overrides=NO_CONTENTION).summary
    assert s["exposed_comm_measured_s"] == pytest.approx(10e-6)
    assert s["hidden_pct_measured"] == pytest.approx(50.0)
    assert s["exposed_comm_predicted_s"] == pytest.approx(15e-6)
    assert s["hidden_pct_predicted"] == pytest.approx(25.0)


def test_communication_figures_sum_over_ranks() -> None:
    """Measured: rank 0 hides 5 of 20 us, rank 1 all 10 of 10: 15 of 30 us, 50% (not the ranks' mean,
    62.5%), 15 us exposed. Predicted (timeline ops): rank 0 hides 5 of 10, rank 1 5 of 20: 10 of 30,
    33.3% (mean 37.5%), 20 us exposed; its copy and host delay are neither."""
    us = 1e-6
    measured = pd.DataFrame({"rank": [0, 0, 1, 1], "kind": ["gemm", "collective", "gemm", "collective"],
                             "start_s": [0.0, 5 * us, 0.0, 0.0], "duration_s": [10 * us, 20 * us, 30 * us, 10 * us]})
    predicted = pd.DataFrame({"rank": [0, 0, 0, 0, 1, 1],
                              "kind": ["gemm", "collective", "transfer", "delay", "gemm", "collective"],
                              "start_s": [0.0, 5 * us, 0.0, 0.0, 0.0, 25 * us],
                              "end_s": [10 * us, 15 * us, 40 * us, 50 * us, 30 * us, 45 * us]})
    s = comm_summary(measured, predicted)
    assert s["exposed_comm_measured_s"] == pytest.approx(15 * us)
    assert s["hidden_pct_measured"] == pytest.approx(50.0)
    assert s["exposed_comm_predicted_s"] == pytest.approx(20 * us)
    assert s["hidden_pct_predicted"] == pytest.approx(100 / 3)


def test_no_communication_has_no_hidden_share() -> None:
    s = replay(TraceBundle(kernels=table([k("gemm", 0, 10)])), gpu=GPU).summary
    assert s["exposed_comm_measured_s"] == 0.0 and s["exposed_comm_predicted_s"] == 0.0
    assert math.isnan(s["hidden_pct_measured"]) and math.isnan(s["hidden_pct_predicted"])


def test_weighted_error_is_total_error_over_total_measured_time() -> None:
    """Scored kernels measured 10, 30, 60 us, predicted 12, 27, 60, alone 10, 20, 40: |error| 5 of
    100 us (5%; MAPE 10%), naive 30 of 100 (30%; MAPE 22.2%). A kernel that did not overlap and
    an ambiguous one are left out, as from the MAPE."""
    meas = [10.0, 30.0, 60.0, 10.0, 10.0]
    out = pd.DataFrame({
        "name": ["a", "b", "c", "clean", "ambiguous"], "kind": ["gemm"] * 5, "rank": [0] * 5,
        "measured_start_s": [0.0] * 5, "measured_duration_s": [m * 1e-6 for m in meas],
        "predicted_start_s": [0.0] * 5, "predicted_duration_s": [x * 1e-6 for x in (12, 27, 60, 100, 50)],
        "overlapped": [True, True, True, False, True], "isolated_s": [x * 1e-6 for x in (10, 20, 40, 10, 10)],
        "isolated_source": ["signature"] * 3 + ["self", "ambiguous"]})
    s = summarize(out, TraceBundle(kernels=table([k("gemm", 0, 10)])), GPU)
    assert s["weighted_error_pct"] == pytest.approx(5.0)
    assert s["naive_weighted_error_pct"] == pytest.approx(30.0)
    assert s["mape_pct"] == pytest.approx(10.0)
    assert s["naive_mape_pct"] == pytest.approx(200 / 9)
    assert s["scored_faster_than_alone"] == 0


def test_scored_kernels_far_faster_than_alone_are_counted() -> None:
    """Measured 10 us against 16 us alone (1.6x faster: counted) and 12 us against 16 (1.33x: not);
    contention never makes a kernel faster, so the first is another problem behind its signature."""
    out = pd.DataFrame({
        "name": ["a", "b"], "kind": ["gemm"] * 2, "rank": [0] * 2, "measured_start_s": [0.0] * 2,
        "measured_duration_s": [10e-6, 12e-6], "predicted_start_s": [0.0] * 2,
        "predicted_duration_s": [16e-6, 16e-6], "overlapped": [True, True], "isolated_s": [16e-6, 16e-6],
        "isolated_source": ["signature"] * 2})
    s = summarize(out, TraceBundle(kernels=table([k("gemm", 0, 10)])), GPU)
    assert s["scored_faster_than_alone"] == 1


def test_the_replay_keeps_the_trace_rank_numbers() -> None:
    """Ranks 2 and 5 of a job: the timeline's ops and counters say 2 and 5, not the engine's 0 and 1,
    and each op is on the rank its trace row names."""
    df = table([k("gemm", 0, 10, rank=2), k("nccl", 2, 10, stream=9, rank=2, kind="collective", launch_s=1e-6),
                k("gemm", 0, 10, rank=5, launch_s=0.0), k("nccl", 3, 10, stream=9, rank=5, kind="collective")])
    res = replay(TraceBundle(kernels=df), gpu=GPU, counters=True)
    ops = res.timeline.ops.set_index("id")
    assert ops.loc[["r2:s7:0", "r2:s9:1", "r5:s7:2", "r5:s9:3"], "rank"].tolist() == [2, 2, 5, 5]
    assert sorted(set(ops.loc[ops["kind"] != "flow", "rank"])) == [2, 5]
    assert set(res.timeline.counters["rank"]) == {2, 5}


# One block per SM (shared memory): the GEMM's 264 blocks take 2 waves on 132 SMs, 3 on 112.
ONE_PER_SM = {"grid_x": 264, "block_x": 256, "registers_per_thread": 128, "shared_mem_bytes": 150_000}
# An expert-parallel dispatch kernel resident on 20 SMs (one block each) for the whole step.
EP_DISPATCH = {"grid_x": 20, "block_x": 512, "registers_per_thread": 64, "shared_mem_bytes": 200_000}


def _fixed_partition_run() -> pd.DataFrame:
    """A GEMM alone (40 us: 2 waves on 132 SMs), then a dispatch kernel holding 20 SMs for 950 us
    beside ten GEMMs seen only beside it (60 us: 3 waves on the 112 SMs left) and the first GEMM
    again (60 us)."""
    rows = [k("deep_gemm::fp8_gemm_a", 0, 40, kind="gemm", **ONE_PER_SM),
            k("dpsk::ep::internode::dispatch", 50, 950, stream=9, kind="collective", **EP_DISPATCH)]
    rows += [k("deep_gemm::fp8_gemm_b", 55 + 61 * i, 60, kind="gemm", **ONE_PER_SM) for i in range(10)]
    rows.append(k("deep_gemm::fp8_gemm_a", 55 + 61 * 10, 60, kind="gemm", **ONE_PER_SM))
    return table(rows)


def test_kernels_seen_only_beside_resident_communication_keep_their_measured_time() -> None:
    """Communication resident on a fixed share of the SMs (expert-parallel dispatch and combine
    beside grouped GEMMs): a GEMM with no clean instance ran on the 112 SMs left, so it is priced on
    them and replays at its measured 60 us, where pricing it on all 132 gave 3 waves for 2 (90 us).
    A GEMM whose isolated 40 us is a clean instance on the whole GPU does pay the held SMs: 3 waves
    for 2, less its tiles' faster pace on fewer busy SMs (gemm_load_share s; 112 + 112 + 40 blocks
    leave 20 + 20 + 92 SMs idle of 132 in three waves): 40 us x (3 - s) / 2."""
    out = replay(TraceBundle(kernels=_fixed_partition_run()), gpu=GPU, counters=False, overrides=ALL_BLOCKS).kernels
    own = out[out["isolated_source"] == "none"]
    assert len(own) == 10
    np.testing.assert_allclose(own["predicted_duration_s"], 60e-6, rtol=1e-6)
    s = load_calibration(load_gpu(GPU), GPU).params.gemm_load_share
    clean = out[out["isolated_source"] == "signature"]
    np.testing.assert_allclose(clean["predicted_duration_s"], 40e-6 * (3 - s) / 2, rtol=1e-6)


def test_resident_communication_stays_hidden_under_the_shipped_contention() -> None:
    """With the shipped H100 contention the GEMMs seen only beside the dispatch kernel also share
    HBM with it; their measurement already holds that, so they still replay within 0.5% of it, and
    the communication exposed and hidden come out as measured (290 us exposed, 69.5% hidden; the
    targets: within 5% and 2 points)."""
    res = replay(TraceBundle(kernels=_fixed_partition_run()), gpu=GPU, counters=False)
    own = res.kernels[res.kernels["isolated_source"] == "none"]
    np.testing.assert_allclose(own["predicted_duration_s"], own["measured_duration_s"], rtol=0.005)
    s = res.summary
    assert s["exposed_comm_measured_s"] == pytest.approx(290e-6)
    assert s["exposed_comm_predicted_s"] == pytest.approx(s["exposed_comm_measured_s"], rel=0.05)
    assert s["hidden_pct_predicted"] == pytest.approx(s["hidden_pct_measured"], abs=2.0)


@pytest.mark.parametrize(("threads", "blocks"), [(128, 1), (256, 24), (128, 6144)])
def test_a_memory_bound_kernel_of_few_warps_moves_at_most_its_warps_rate(threads: int, blocks: int) -> None:
    """Little's law (Parameters.memory_warp_bytes_per_s): a memory-bound kernel's bytes are its
    data-moving time at the lower of HBM's achievable rate and its resident warps' rate. 1 block of
    4 warps, 24 of 8 and 6144 of 4 (one wave of 6144 blocks fits the H100: 16 blocks of 128 threads
    per SM x 132 SMs = 2112, so 2112 resident x 4 warps)."""
    from ovsim.replay_kernels import KernelColumns, data_moving_s, kernel_demand

    gpu = load_gpu("h100-sxm5-80gb")
    params = load_calibration(gpu, "h100-sxm5-80gb").params.merged({"memory_warp_bytes_per_s": 5e8})
    table = make_table({"rank": [0], "stream": [7], "name": ["vectorized_elementwise_kernel<4, AddFunctor>"],
                        "start_s": [0.0], "duration_s": [20e-6], "grid_x": [blocks], "block_x": [threads]})
    d = kernel_demand(KernelColumns.of(table), 0, 20e-6, gpu, params)
    resident = min(blocks, 132 * occupancy.blocks_per_sm(cost.BlockShape(threads, 32, 0), gpu))
    warps = resident * threads // 32
    hbm = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction * params.memory_kernel_efficiency
    assert d.hbm_bytes == pytest.approx(data_moving_s(20e-6, params) * min(hbm, warps * 5e8), rel=1e-12)
    # Without the law (the schema default) every memory-bound kernel moves at HBM's rate.
    d0 = kernel_demand(KernelColumns.of(table), 0, 20e-6, gpu, params.merged({"memory_warp_bytes_per_s": 0.0}))
    assert d0.hbm_bytes == pytest.approx(data_moving_s(20e-6, params) * hbm, rel=1e-12)


@pytest.mark.parametrize(("blocks", "waves"), [(320, 1.48), (216, 1.0), (500, 2.31), (100, 0.46)])
def test_a_memory_bound_kernel_alone_takes_its_own_measured_time(blocks: int, waves: float) -> None:
    """The engine's own invariant (cost.demand_from_time): a kernel alone takes its isolated time.
    On an A100 (no HBM headroom: a kernel's time follows its blocks) a memory-bound kernel of 1.48
    waves of 2 blocks per SM (512 threads, 48 registers) has its full wave carry 216/320 of the
    bytes in half the time; with its bytes read backwards at HBM's rate that wave asked 1.35x what
    HBM gives, and a real trace's Adam step (320 such blocks, 383 us) replayed at 443 us alone."""
    rows = [k("multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>", 0.0, 383.0, kind="elementwise",
              grid_x=blocks, block_x=512, registers_per_thread=48)]
    bundle = TraceBundle(kernels=table(rows), gpu_names={0: "NVIDIA A100-SXM4-80GB"})
    res = replay(bundle, counters=False)
    assert res.kernels["isolated_source"].tolist() == ["self"]
    assert res.kernels["predicted_duration_s"].iloc[0] == pytest.approx(383e-6, rel=1e-9)
    assert blocks / (108 * 2) == pytest.approx(waves, abs=0.01)


def test_sms_a_kernel_had_are_its_rank_s_held_sms_averaged_over_its_interval() -> None:
    """Against the direct sum (each collective's held blocks x its overlap with the kernel, over
    the kernel's duration): two collectives of 20 and 16 blocks, one kernel under both, one partly
    under the first, one under none, on a rank whose collectives hold their grid."""
    from ovsim.replay_kernels import sms_measured_on

    rows = [k("dpsk::ep::dispatch", 0, 100, stream=9, kind="collective", **EP_DISPATCH),
            k("dpsk::ep::combine", 50, 100, stream=10, kind="collective", **{**EP_DISPATCH, "grid_x": 16}),
            k("g", 60, 20, kind="gemm"), k("g2", 90, 40, kind="gemm"), k("g3", 300, 10, kind="gemm")]
    c = KernelColumns.of(table(rows))
    gpu = load_gpu(GPU)
    params = load_calibration(gpu, GPU).params.merged(ALL_BLOCKS)
    src = np.array(["measured", "measured", "none", "none", "none"], dtype=object)
    sms = sms_measured_on(c, src, gpu, params)
    # g: 36 held throughout; g2: 36 for 10 us, then 16 for 30 us (mean 21); g3: none.
    assert sms[2:].tolist() == [132 - 36, 132 - 21, 132]
