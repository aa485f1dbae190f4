"""calibration/harness/ingest.py on a hand-made run folder: what it writes, what it refuses."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
from ingest import IngestError, ingest, main

from ovsim.traces.load import read_tables
from ovsim.traces.power import read_power_samples

GEMM = "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NTN"


def kernel(name: str, ts_us: float, dur_us: float, corr: int, stream: int = 7) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts_us, "dur": dur_us,
            "args": {"device": 0, "stream": stream, "correlation": corr, "registers per thread": 96,
                     "shared memory": 82240, "grid": [16, 1, 1], "block": [640, 1, 1]}}


def trace(events: list[dict[str, Any]]) -> bytes:
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
           "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": events}
    return gzip.compress(json.dumps(doc).encode())


def make_run(root: Path) -> Path:
    """One overlap experiment (three 1 ms GEMMs alone, three of 1.25 ms beside a channel kernel) and
    one dispatch probe whose second kernel waited for the first to place every block."""
    run = root / "run"
    (run / "overlap").mkdir(parents=True)
    (run / "dispatch").mkdir()
    (run / "manifest.json").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.1",
                                                   "commit": "abc123", "date_utc": "2026-11-25T00:00:00+00:00"}))
    events = [kernel(GEMM, 1000 + 2000 * i, 1000, i + 1) for i in range(3)]
    events.append(kernel("ovsim_channel_copy", 10_000, 6000, 10, stream=13))
    events += [kernel(GEMM, 10_100 + 1500 * i, 1250, 20 + i) for i in range(3)]
    (run / "overlap" / "g__copy_16__high__comm_first.json.gz").write_bytes(trace(events))
    (run / "dispatch" / "probe_empty_sm_high.json.gz").write_bytes(trace([kernel("ovsim_probe_first", 0, 500, 1),
                                                                          kernel("ovsim_probe_second", 400, 100, 2)]))
    lines = ["kernel,launch,block,smid,start_ns,end_ns"]
    lines += [f"ovsim_probe_first,0,{i},{i % 2},{1000 + (i // 2) * 100_000},{101_000 + (i // 2) * 100_000}"
              for i in range(8)]
    lines += [f"ovsim_probe_second,0,{i},{i},{400_000 + i},{500_000}" for i in range(2)]
    (run / "dispatch" / "probe_empty_sm_high.blocks.csv").write_text("\n".join(lines) + "\n")
    (run / "overlap" / "experiments.jsonl").write_text(json.dumps(
        {"label": "g__copy_16__high__comm_first", "part": "overlap", "priority": "high"}) + "\n")
    (run / "dispatch" / "experiments.jsonl").write_text(json.dumps(
        {"label": "probe_empty_sm_high", "part": "dispatch"}) + "\n")
    (run / "power.csv").write_text("timestamp, index, power.draw.instant [W]\n2026/11/25 00:00:00.000, 0, 70.5\n")
    return run


def add_idle_power(run: Path) -> None:
    """A power part of one experiment that launches nothing (its span is its host activity)."""
    (run / "power").mkdir()
    host = {"ph": "X", "cat": "user_annotation", "name": "sleep", "pid": 0, "tid": 1, "ts": 2_000_000.0,
            "dur": 4_000_000.0}
    (run / "power" / "idle.json.gz").write_bytes(trace([host]))
    (run / "power" / "experiments.jsonl").write_text(json.dumps({"label": "idle", "part": "power"}) + "\n")


def test_ingest_writes_tables_blocks_summary_and_checksums(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    add_idle_power(run)
    dest = tmp_path / "data"
    summary = ingest(run, dest, raw_limit_bytes=10**6)
    # One file a part, each experiment read back as a run of its own.
    assert sorted(p.name for p in (dest / "tables").iterdir()) == ["dispatch.parquet", "overlap.parquet",
                                                                   "power.parquet"]
    table = read_tables(dest / "tables" / "overlap.parquet")["g__copy_16__high__comm_first"]
    assert table.gpu_names == {0: "NVIDIA H100 80GB HBM3"}
    # The table names its trace by its place in the run, never by the ingesting machine's path.
    assert table.sources == {0: "overlap/g__copy_16__high__comm_first.json.gz"}
    assert table.kernels.loc[table.kernels["name"] == "ovsim_channel_copy", "kind"].tolist() == ["collective"]
    (row,) = summary["slowdowns"]
    assert (row["alone_n"], row["overlapped_n"]) == (3, 3)
    assert row["slowdown"] == pytest.approx(1.25)  # 1.25 ms beside the channel kernel, 1 ms alone
    (probe,) = summary["dispatch"]
    assert not probe["second_went_ahead"] and probe["second_wait_s"] == pytest.approx(399e-6)
    blocks = pd.read_parquet(dest / "blocks.parquet")
    assert len(blocks) == 10 and set(blocks["experiment"]) == {"probe_empty_sm_high"}
    prov = json.loads((dest / "PROVENANCE.json").read_text())
    assert prov["harness_commit"] == "abc123" and prov["raw_traces"].startswith("kept for the part(s) a fit reads")
    # Raw traces only where a fit reads them: the power part's.
    assert sorted(p.name for p in (dest / "raw").iterdir()) == ["power"]
    raw = dest / "raw" / "power" / "idle.json.gz"
    assert prov["files"]["raw/power/idle.json.gz"]["sha256"] == hashlib.sha256(raw.read_bytes()).hexdigest()
    # The power log travels compressed, byte for byte, and ovsim's reader takes it as it is.
    assert gzip.decompress((dest / "power.csv.gz").read_bytes()) == (run / "power.csv").read_bytes()
    assert read_power_samples(dest / "power.csv.gz")["power_w"].tolist() == [70.5]
    # Each experiment's span on the wall clock: the trace's base time plus its kernels' extent.
    windows = json.loads((dest / "windows.json").read_text())
    assert windows["overlap/g__copy_16__high__comm_first"] == pytest.approx([1_700_000_000.001, 1_700_000_000.016])
    assert windows["dispatch/probe_empty_sm_high"] == pytest.approx([1_700_000_000.0, 1_700_000_000.0005])
    meta = pq.read_metadata(dest / "blocks.parquet").row_group(0)
    assert meta.column(0).compression == "ZSTD"
    stamps = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == "start_ns")
    assert "DELTA_BINARY_PACKED" in stamps.encodings
    assert pq.read_metadata(dest / "tables" / "overlap.parquet").row_group(0).column(0).compression == "ZSTD"


def test_an_experiment_with_no_kernels_is_placed_by_its_host_spans(tmp_path: Path) -> None:
    """The idle power phase launches nothing: its span is the profiler's host activity."""
    run = make_run(tmp_path)
    add_idle_power(run)
    dest = tmp_path / "data"
    ingest(run, dest, raw_limit_bytes=0)
    assert json.loads((dest / "windows.json").read_text())["power/idle"] == pytest.approx(
        [1_700_000_002.0, 1_700_000_006.0])


def add_clock_part(run: Path) -> None:
    """A clock part of one experiment: three GEMMs, each between two probes."""
    (run / "clock").mkdir()
    events = []
    for i in range(3):
        events.append(kernel("ovsim_clock_probe", 2000 * i, 100, 2 * i + 1))
        events.append(kernel(GEMM, 2000 * i + 200, 1000, 2 * i + 2))
    events.append(kernel("ovsim_clock_probe", 6000, 100, 7))
    (run / "clock" / "g.json.gz").write_bytes(trace(events))
    (run / "clock" / "g.clock.csv").write_text("launch,smid,start_ns,end_ns,sm_cycles\n" + "".join(
        f"{i},0,{i * 2_000_000},{i * 2_000_000 + 100_000},{int(1.5e5) + i * 1000}\n" for i in range(4)))
    (run / "clock" / "experiments.jsonl").write_text(json.dumps({"label": "g", "part": "clock"}) + "\n")


def test_clock_tables_can_be_left_to_clock_parquet(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    add_clock_part(run)
    dest = tmp_path / "data"
    ingest(run, dest, raw_limit_bytes=0, clock_tables=False)
    assert not (dest / "tables" / "clock.parquet").exists() and (dest / "tables" / "overlap.parquet").is_file()
    points = pd.read_parquet(dest / "clock.parquet")
    assert points["name"].tolist() == [GEMM] * 3
    assert points["sm_clock_hz"].tolist() == pytest.approx([1.505e9, 1.515e9, 1.525e9])
    assert "clock part's kernels are in clock.parquet" in json.loads((dest / "PROVENANCE.json").read_text())[
        "clock_tables"]


def test_a_run_of_the_clock_part_alone_ingests_without_its_tables(tmp_path: Path) -> None:
    """Nothing but clock.parquet to write before the provenance: the folder must still be made."""
    run = make_run(tmp_path)
    for part in ("overlap", "dispatch"):
        shutil.rmtree(run / part)
    add_clock_part(run)
    dest = tmp_path / "data"
    ingest(run, dest, raw_limit_bytes=0, clock_tables=False)
    assert len(pd.read_parquet(dest / "clock.parquet")) == 3 and not (dest / "tables").exists()


def test_raw_traces_over_the_limit_are_left_out_and_said_so(tmp_path: Path) -> None:
    dest = tmp_path / "data"
    run = make_run(tmp_path)
    add_idle_power(run)
    ingest(run, dest, raw_limit_bytes=10)
    assert not (dest / "raw").exists()
    assert json.loads((dest / "PROVENANCE.json").read_text())["raw_traces"].startswith("left out")


def test_refusals_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path)
    dest = tmp_path / "data"
    ingest(run, dest, raw_limit_bytes=0)
    with pytest.raises(IngestError, match="exists and is not empty"):
        ingest(run, dest, raw_limit_bytes=0)
    (run / "dispatch" / "probe_empty_sm_high.json.gz").write_bytes(trace([kernel("ovsim_probe_first", 0, 500, 1)]))
    with pytest.raises(IngestError, match="no ovsim_probe_second kernel in the trace"):
        ingest(run, tmp_path / "other", raw_limit_bytes=0)
    # A failed ingest leaves nothing behind, and --force replaces a complete data set only on success.
    assert not (tmp_path / "other").exists() and not (tmp_path / "other.partial").exists()
    before = sorted(p.relative_to(dest) for p in dest.rglob("*"))
    with pytest.raises(IngestError):
        ingest(run, dest, raw_limit_bytes=0, force=True)
    assert sorted(p.relative_to(dest) for p in dest.rglob("*")) == before
    (run / "dispatch" / "probe_empty_sm_high.json.gz").unlink()
    with pytest.raises(IngestError, match=r"probe_empty_sm_high\.json\.gz: missing"):
        ingest(run, tmp_path / "other", raw_limit_bytes=0)
    (run / "manifest.json").unlink()
    assert main([str(run), "--dest", str(tmp_path / "third")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manifest.json: missing" in err


def test_an_ingested_run_calibrates_contention_in_ovsim(tmp_path: Path) -> None:
    # The GEMMs run 1.25x beside the channel kernel. Taken as a collective, the channel kernel makes
    # them the overlapped kernels of a contention fit, and the fitted engine replays them; without
    # contention the replay is the naive 1 ms, 20% off.
    from ovsim.calibrate import calibrate
    from ovsim.validate.datasets import experiment_inputs

    ingest(make_run(tmp_path), tmp_path / "data", raw_limit_bytes=0)
    inputs = experiment_inputs(tmp_path / "data", "overlap", "h100-sxm5-80gb")
    assert [tr.label for tr in inputs] == ["g__copy_16__high__comm_first.parquet"]
    fit = calibrate(inputs, "*", quantities=["contention"]).fits["contention"]
    (label,) = fit["engine_mape_pct_without"]
    assert fit["engine_mape_pct_without"][label] == pytest.approx(20.0)
    assert fit["engine_mape_pct_fitted"][label] < 1.0


def test_copy_part_slowdowns_are_against_copies_and_a_part_listed_twice_counts_once(tmp_path: Path) -> None:
    """The copy part's GEMMs run beside copy-engine transfers: their slowdown is measured against
    those (the summary had none when only collectives counted). An experiments.jsonl that lists an
    experiment twice (a part run twice into one folder) gives one experiment, with one set of blocks;
    NVML's average power log travels with the instantaneous one."""
    run = make_run(tmp_path)
    (run / "copy").mkdir()
    events = [kernel(GEMM, 1000 + 2000 * i, 1000, i + 1) for i in range(3)]
    memcpy = kernel("Memcpy HtoD (Pinned -> Device)", 10_000, 8000, 10, stream=13)
    memcpy["cat"] = "gpu_memcpy"
    events.append(memcpy)
    events += [kernel(GEMM, 10_100 + 1500 * i, 1100, 20 + i) for i in range(3)]
    (run / "copy" / "g__h2d.json.gz").write_bytes(trace(events))
    (run / "copy" / "experiments.jsonl").write_text(json.dumps({"label": "g__h2d", "part": "copy"}) + "\n")
    listing = run / "dispatch" / "experiments.jsonl"
    listing.write_text(listing.read_text() * 2)
    (run / "power_average.csv").write_text("timestamp, index, power.draw.average [W]\n2026/11/25 00:00:00.000, 0, 70\n")
    dest = tmp_path / "data"
    summary = ingest(run, dest, raw_limit_bytes=0)
    copy = [r for r in summary["slowdowns"] if r["part"] == "copy"]
    assert len(copy) == 1 and (copy[0]["alone_n"], copy[0]["overlapped_n"]) == (3, 3)
    assert copy[0]["slowdown"] == pytest.approx(1.1)
    assert len(pd.read_parquet(dest / "blocks.parquet")) == 10
    assert [p["experiment"] for p in summary["dispatch"]] == ["probe_empty_sm_high"]
    assert (dest / "experiments.jsonl").read_text().count("probe_empty_sm_high") == 1
    assert gzip.decompress((dest / "power_average.csv.gz").read_bytes()) == (run / "power_average.csv").read_bytes()


def test_smloss_slowdowns_are_against_the_sm_holding_probe_and_an_elementwise_victim_stays_a_victim(
        tmp_path: Path) -> None:
    """The smloss part's probe holds SMs and computes nothing; ovsim's importer files its unknown name
    as elementwise, like the add it runs beside. The add's slowdown is measured against the probe,
    and the probe itself is not reported as a victim."""
    run = make_run(tmp_path)
    (run / "smloss").mkdir()
    add = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >"
    events = [kernel(add, 1000 + 2000 * i, 500, i + 1) for i in range(3)]
    events.append(kernel("ovsim_probe_first", 10_000, 6000, 10, stream=13))
    events += [kernel(add, 10_100 + 1500 * i, 600, 20 + i) for i in range(3)]
    (run / "smloss" / "add__hold_16.json.gz").write_bytes(trace(events))
    (run / "smloss" / "experiments.jsonl").write_text(json.dumps({"label": "add__hold_16", "part": "smloss"}) + "\n")
    summary = ingest(run, tmp_path / "data", raw_limit_bytes=0)
    held = [r for r in summary["slowdowns"] if r["part"] == "smloss"]
    assert [r["name"] for r in held] == [add]
    assert (held[0]["alone_n"], held[0]["overlapped_n"]) == (3, 3)
    assert held[0]["slowdown"] == pytest.approx(1.2)


def test_a_run_of_an_ncu_part_alone_is_a_data_set(tmp_path: Path) -> None:
    """An Nsight Compute part lists no experiments: its run keeps the metrics table and manifest."""
    run = tmp_path / "run"
    (run / "own_tiles_ncu").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"gpu": "NVIDIA H200", "commit": "abc123"}))
    (run / "own_tiles_ncu" / "metrics.csv").write_text('"ID","Kernel Name"\n"0","k"\n')
    ingest(run, tmp_path / "data", raw_limit_bytes=0)
    prov = json.loads((tmp_path / "data" / "PROVENANCE.json").read_text())
    assert "own_tiles_ncu/metrics.csv" in prov["files"] and "manifest.json" in prov["files"]
    (run / "own_tiles_ncu" / "metrics.csv").unlink()  # nothing measured: still refused
    with pytest.raises(IngestError, match=r"no <part>/experiments\.jsonl"):
        ingest(run, tmp_path / "other", raw_limit_bytes=0)
