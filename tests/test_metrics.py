"""Overlap metrics: closed forms on small tables, and agreement with Holistic Trace Analysis's
``get_comm_comp_overlap`` on every shared real trace with NCCL kernels (HTA is the reference)."""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path

import pandas as pd
import pytest
from shared_traces import real

from ovsim.api import predict
from ovsim.metrics import rank_overlap, stream_busy, union_intervals
from ovsim.scenario import Scenario
from ovsim.traces.kineto import load_kineto
from ovsim.traces.table import make_table

NCCL_TRACES = [
    "HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz",
    "HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz",
    "HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_diff/test/test.json.gz",
    "HolisticTraceAnalysis/tests/data/df_index_resolver/df_index_resolver.json.gz",
    "TraceLens/tests/traces/mi300/resnet_act_checkpoint.json.gz",
    "TraceLens/tests/traces/b200/eager_trace.json.gz",
]


def test_overlap_closed_form() -> None:
    """Compute [0, 10) and [25, 35) us, communication [5, 15) us: 5 us of 10 hidden, 5 exposed,
    busy [0, 15) and [25, 35), so 10 us of the 35 us span idle; the copy counts as neither."""
    t = make_table({"rank": [0, 0, 0, 0], "stream": [7, 7, 9, 11],
                    "name": ["gemm", "gemm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "Memcpy DtoD"],
                    "start_s": [0.0, 25e-6, 5e-6, 0.0], "duration_s": [10e-6, 10e-6, 10e-6, 30e-6]})
    (o,) = rank_overlap(t)
    assert o.comm_busy_s == pytest.approx(10e-6)
    assert o.overlapped_s == pytest.approx(5e-6)
    assert o.comm_hidden_fraction == pytest.approx(0.5)
    assert o.exposed_comm_s == pytest.approx(5e-6)
    assert o.idle_s == pytest.approx(10e-6)
    busy = stream_busy(t).set_index("stream")["busy_s"]
    assert busy.loc[7] == pytest.approx(20e-6) and busy.loc[9] == pytest.approx(10e-6)


def _last_step_start_us(path: Path) -> float | None:
    """Start of the trace's last ProfilerStep: HTA leaves that (often partial) step out by default."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = [float(e["ts"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("ph") == "X"]
    return max(steps) if len(steps) > 1 else None


def _hta_overlap(path: Path, tmp: Path) -> float:
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed")
    logging.disable(logging.WARNING)
    try:
        os.symlink(path, tmp / path.name)
        try:
            df = hta.TraceAnalysis(trace_dir=str(tmp)).get_comm_comp_overlap(visualize=False)
        except Exception as e:  # HTA itself fails on some traces with recent pandas; nothing to compare
            pytest.skip(f"HTA cannot analyse {path.name}: {type(e).__name__}")
    finally:
        logging.disable(logging.NOTSET)
    return float(df["comp_comm_overlap_pctg"].iloc[0])


@pytest.mark.parametrize("rel", NCCL_TRACES)
def test_overlap_agrees_with_hta(rel: str, tmp_path: Path) -> None:
    path = real(rel)
    reference = _hta_overlap(path, tmp_path)
    kernels = load_kineto(path).kernels
    last = _last_step_start_us(path)
    if last is not None:
        # Same window as HTA (Trace._filter_irrelevant_gpu_kernels): only kernels whose launch call
        # is in the trace and came before the last profiler step began.
        kernels = kernels[kernels["launch_s"].notna() & (kernels["launch_s"] * 1e6 < last)]
    (o,) = rank_overlap(kernels)
    assert o.comm_hidden_fraction * 100 == pytest.approx(reference, abs=0.5)


def test_copy_engine_transfers_are_neither_compute_nor_communication() -> None:
    """A simulated timeline's ``transfer`` (a copy-engine flow: a replayed memcpy, a scenario's copy)
    is HTA's memory category. Compute [0, 10) us, an all-reduce [5, 15), a copy [0, 30): 5 us of
    the all-reduce's 10 hidden; the copy adds no communication, hides none and runs no compute,
    so of the 30 us span 15 are idle. Counted as communication, it would make 30 us of it, 10 hidden."""
    ops = pd.DataFrame({"rank": [0, 0, 0], "stream": ["compute", "comm", "copy"],
                        "kind": ["gemm", "collective", "transfer"], "start_s": [0.0, 5e-6, 0.0],
                        "end_s": [10e-6, 15e-6, 30e-6]})
    (o,) = rank_overlap(ops)
    assert o.comm_busy_s == pytest.approx(10e-6)
    assert o.overlapped_s == pytest.approx(5e-6)
    assert o.compute_busy_s == pytest.approx(10e-6)
    assert o.idle_s == pytest.approx(15e-6)


def test_pipeline_send_recv_counts_as_communication() -> None:
    """A two-stage pipeline on two GPUs (no data or tensor parallelism) communicates by its
    send/recv and, its embedding tied, by the sum of the two ends' embedding gradients, NCCL
    kernels in a real run: all of each rank's communication is their time on the pipeline's
    streams and the stream the sum runs on, none of it dropped as a copy."""
    sc = Scenario.model_validate({"name": "pp2", "system": "a100x4", "ranks": 2, "training": {
        "model": "gpt3-1.3b", "layers": 2, "micro_batch_size": 1, "seq_len": 1024, "precision": "bf16",
        "micro_batches": 2, "parallel": {"pp": 2, "pipeline": "1f1b"}}})
    ops = predict(sc).ops
    for o in rank_overlap(ops):
        mine = ops[ops["rank"] == o.rank]
        p2p = mine[mine["stream"].str.startswith("pp") | mine["name"].str.startswith("embedding_grad_sum")]
        assert (p2p["stream"] == "dp").sum() == 1 and (p2p["stream"] != "dp").sum() > 0
        busy = union_intervals(p2p["start_s"].to_numpy(float), p2p["end_s"].to_numpy(float))
        assert o.comm_busy_s == pytest.approx(sum(e - s for s, e in busy), rel=1e-12)


def test_a_collective_on_the_copy_engines_counts_as_communication() -> None:
    """An all-gather offloaded to the copy engines is communication, unlike a plain copy: each
    rank's communication is its all-gather's time on the comm stream."""
    sc = Scenario.model_validate({"name": "ce", "system": "hgx-h100", "ranks": 2, "ops": [
        {"name": "ag", "kind": "all_gather", "size_bytes": 256e6, "engine": "copy_engine", "stream": "comm"},
        {"name": "add", "kind": "elementwise", "bytes": 4e9, "stream": "compute"}]})
    ops = predict(sc).ops
    ag = ops[(ops["name"] == "ag") & (ops["rank"] >= 0)]
    assert set(ag["kind"]) == {"collective"}
    for o in rank_overlap(ops):
        mine = ag[ag["rank"] == o.rank]
        assert o.comm_busy_s == pytest.approx(float((mine["end_s"] - mine["start_s"]).sum()), rel=1e-12)
        assert o.comm_busy_s > 0


def test_stream_busy_groups_as_a_group_by_does() -> None:
    # pandas' group-by (the reference): sorted by rank then stream, rows without a stream left out.
    table = pd.DataFrame({"rank": [1, 0, 0, 0, 1], "stream": ["b", "a", None, "a", "b"],
                          "start_s": [0.0, 0.0, 0.0, 2.0, 1.0], "end_s": [2.0, 1.0, 5.0, 3.0, 3.0]})
    expect = [{"rank": r, "stream": s, "busy_s": sum(_union(g)), "ops": len(g)}
              for (r, s), g in table.groupby(["rank", "stream"], sort=True)]
    assert stream_busy(table).to_dict(orient="records") == expect
    assert [row["busy_s"] for row in expect] == [2.0, 3.0]
    # Streams named by numbers and by words in one table (a user's table) still sort.
    mixed = table.assign(stream=[1, "a", "a", "a", 2])
    assert len(stream_busy(mixed)) == 3


def _union(g: pd.DataFrame) -> list[float]:
    return [e - s for s, e in union_intervals(g["start_s"].to_numpy(float), g["end_s"].to_numpy(float))]
