"""calibration/harness/analysis.py on planted per-block records and kernel tables whose answers
follow from how they were built."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from analysis import (
    CLOCK_PROBE,
    HarnessDataError,
    clock_points,
    dispatch_order,
    max_resident,
    overlap_slowdowns,
    read_blocks,
    read_clock_probes,
    residency,
)

US = 1000  # ns


def test_max_resident_counts_open_intervals_and_not_touching_ones() -> None:
    assert max_resident([0, 0, 0], [10, 10, 10]) == 3
    # [0,10) and [10,20) touch but never run together.
    assert max_resident([0, 5, 10], [10, 15, 20]) == 2
    assert max_resident([0, 10, 20], [10, 20, 30]) == 1


def waves(kernel: str, sms: int, per_sm: int, n_waves: int, block_ns: int, t0_ns: int = 0,
          launch: int = 0) -> list[dict[str, int | str]]:
    """Blocks of a kernel placed wave by wave: ``per_sm`` at once on each SM."""
    rows: list[dict[str, int | str]] = []
    for w in range(n_waves):
        for sm in range(sms):
            for _ in range(per_sm):
                s = t0_ns + w * block_ns
                rows.append({"kernel": kernel, "launch": launch, "block": len(rows), "smid": sm,
                             "start_ns": s, "end_ns": s + block_ns})
    return rows


def test_residency_reads_blocks_per_sm_and_block_time() -> None:
    b = pd.DataFrame(waves("g", sms=4, per_sm=3, n_waves=2, block_ns=100 * US, t0_ns=1))
    r = residency(b).iloc[0]
    assert (r["blocks"], r["sms"], r["max_resident_per_sm"]) == (24, 4, 3)
    assert r["block_s_median"] == pytest.approx(100e-6)
    assert r["span_s"] == pytest.approx(200e-6)


def test_dispatch_order_tells_a_kernel_that_went_ahead_from_one_that_waited() -> None:
    # First kernel: 4 SMs x 2 blocks x 5 waves of 100 us. The second arrives at 250 us.
    first = waves("first", sms=4, per_sm=2, n_waves=5, block_ns=100 * US, t0_ns=1)
    # Went ahead: SMs 0-1 drain at 300 us and run the second kernel for 100 us; the first kernel's
    # later waves there start after it (its remaining blocks on those SMs shift by 100 us).
    ahead = [dict(r) for r in first]
    for r in ahead:
        if int(r["smid"]) < 2 and int(r["start_ns"]) >= 300 * US:
            r["start_ns"] = int(r["start_ns"]) + 100 * US
            r["end_ns"] = int(r["end_ns"]) + 100 * US
    second_ahead = [{"kernel": "second", "launch": 0, "block": i, "smid": i, "start_ns": 300 * US + 1,
                     "end_ns": 400 * US + 1} for i in range(2)]
    went = dispatch_order(pd.DataFrame(ahead + second_ahead), "first", "second")
    # Waves 3 and 4 on the two SMs it took (2 x 2 x 2) and wave 4 on the other two (2 x 2).
    assert went["second_went_ahead"] and went["first_blocks_started_after_second"] == 12
    assert went["second_wait_s"] == pytest.approx(300e-6)
    # Waited: the first kernel places every block, the second starts when its last wave ends.
    second_late = [{"kernel": "second", "launch": 0, "block": i, "smid": i, "start_ns": 500 * US + 1,
                    "end_ns": 600 * US + 1} for i in range(2)]
    waited = dispatch_order(pd.DataFrame(first + second_late), "first", "second")
    assert not waited["second_went_ahead"] and waited["first_blocks_started_after_second"] == 0
    assert waited["first_last_start_s"] == pytest.approx(400e-6)
    with pytest.raises(HarnessDataError, match="second"):
        dispatch_order(pd.DataFrame(first), "first", "second")


def test_read_blocks_refuses_a_block_that_wrote_no_record(tmp_path: Path) -> None:
    p = tmp_path / "x.blocks.csv"
    p.write_text("kernel,launch,block,smid,start_ns,end_ns\nk,0,0,3,100,200\nk,0,1,0,0,0\n")
    with pytest.raises(HarnessDataError, match=r"x\.blocks\.csv: start_ns/end_ns: block 1 of k"):
        read_blocks(p)
    p.write_text("kernel,launch,block,start_ns,end_ns\nk,0,0,100,200\n")
    with pytest.raises(HarnessDataError, match="no column smid"):
        read_blocks(p)


def kernel_row(name: str, kind: str, start_s: float, duration_s: float, experiment: str = "e") -> dict[str, object]:
    return {"experiment": experiment, "rank": 0, "device": 0, "stream": 7, "name": name, "kind": kind,
            "start_s": start_s, "duration_s": duration_s, "grid_x": 64, "grid_y": 1, "grid_z": 1, "block_x": 256}


def test_overlap_slowdowns_split_instances_by_a_resident_collective() -> None:
    # Three GEMMs of 1 ms alone, then a collective from 10 ms to 20 ms and three GEMMs of 1.5 ms under it.
    rows = [kernel_row("gemm", "gemm", t, 1e-3) for t in (0.0, 2e-3, 4e-3)]
    rows.append(kernel_row("ovsim_channel_copy", "collective", 10e-3, 10e-3))
    rows += [kernel_row("gemm", "gemm", t, 1.5e-3) for t in (11e-3, 13e-3, 15e-3)]
    # A kernel on another device is not overlapped by this device's collective.
    other = kernel_row("gemm", "gemm", 12e-3, 1e-3)
    other["device"] = 1
    sd = overlap_slowdowns(pd.DataFrame([*rows, other]))
    g = sd[sd["name"] == "gemm"].iloc[0]
    assert (g["alone_n"], g["overlapped_n"]) == (4, 3)
    assert g["slowdown"] == pytest.approx(1.5)


def test_copy_part_slowdowns_count_kernels_a_copy_overlapped() -> None:
    """In the copy part a GEMM runs beside copy-engine transfers, not collectives: measured against
    copies it has a slowdown; measured against collectives it would have none to report."""
    rows = [kernel_row("gemm", "gemm", t, 1e-3) for t in (0.0, 2e-3)]
    rows.append({**kernel_row("Memcpy HtoD (Pinned -> Device)", "copy", 10e-3, 10e-3), "stream": 9})
    rows += [kernel_row("gemm", "gemm", t, 1.2e-3) for t in (11e-3, 13e-3, 15e-3)]
    # A collective in the same table is not a copy: it does not count as the overlapper here.
    rows.append({**kernel_row("ovsim_channel_copy", "collective", 30e-3, 5e-3), "stream": 13})
    rows.append(kernel_row("gemm", "gemm", 31e-3, 1e-3))
    df = pd.DataFrame(rows)
    g = overlap_slowdowns(df, overlapper="copy").set_index("name").loc["gemm"]
    assert (g["alone_n"], g["overlapped_n"]) == (3, 3)
    assert g["slowdown"] == pytest.approx(1.2)
    by_coll = overlap_slowdowns(df).set_index("name").loc["gemm"]
    assert (by_coll["alone_n"], by_coll["overlapped_n"]) == (5, 1)
    with pytest.raises(ValueError, match="overlapper"):
        overlap_slowdowns(df, overlapper="gemm")


def probe_file(tmp_path: Path, clocks_hz: list[float], window_ns: int = 100_000) -> Path:
    rows = [{"launch": i, "smid": 3, "start_ns": 10**9 + i * 10**7, "end_ns": 10**9 + i * 10**7 + window_ns,
             "sm_cycles": round(hz * window_ns * 1e-9)} for i, hz in enumerate(clocks_hz)]
    p = tmp_path / "x.clock.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    return p


def test_a_probe_clock_is_its_cycles_over_its_window(tmp_path: Path) -> None:
    probes = read_clock_probes(probe_file(tmp_path, [1.98e9, 1.5e9]))
    assert probes["sm_clock_hz"].tolist() == pytest.approx([1.98e9, 1.5e9], rel=1e-6)


@pytest.mark.parametrize("field,value", [("sm_cycles", 0), ("end_ns", 0), ("launch", 7)])
def test_a_probe_record_never_written_or_out_of_order_is_refused(tmp_path: Path, field: str, value: int) -> None:
    p = probe_file(tmp_path, [1.98e9, 1.5e9, 1.4e9])
    df = pd.read_csv(p)
    df.loc[1, field] = value
    df.to_csv(p, index=False)
    with pytest.raises(HarnessDataError, match=r"x\.clock\.csv"):
        read_clock_probes(p)


def clock_trace(groups: list[list[float]]) -> pd.DataFrame:
    """Probe, a group of kernels (durations in s), probe, ...: the clock part's stream; a memset
    between the first two kernels, as PyTorch launches some on the same stream."""
    rows, t = [], 0.0
    for durs in groups:
        rows.append({"name": CLOCK_PROBE, "kind": "elementwise", "start_s": t, "duration_s": 1e-4})
        t += 1e-4
        for i, d in enumerate(durs):
            rows.append({"name": "gemm", "kind": "gemm", "start_s": t, "duration_s": d})
            t += d
            if i == 0:
                rows.append({"name": "Memset (Device)", "kind": "memset", "start_s": t, "duration_s": 1e-6})
    rows.append({"name": CLOCK_PROBE, "kind": "elementwise", "start_s": t, "duration_s": 1e-4})
    # Rows out of time order, as a table may hold them.
    return pd.DataFrame(rows[::-1])


def test_each_kernel_gets_the_mean_clock_of_the_probes_around_its_group(tmp_path: Path) -> None:
    kernels = clock_trace([[1e-3, 2e-3], [3e-3]])
    probes = read_clock_probes(probe_file(tmp_path, [1.9e9, 1.7e9, 1.5e9]))
    pts = clock_points(kernels, probes).sort_values("start_s")
    assert pts["duration_s"].tolist() == [1e-3, 2e-3, 3e-3]
    assert pts["sm_clock_hz"].tolist() == pytest.approx([1.8e9, 1.8e9, 1.6e9], rel=1e-6)
    assert pts["clock_step_hz"].tolist() == pytest.approx([2e8, 2e8, 2e8], rel=1e-6)


def test_probes_and_trace_of_different_experiments_are_refused(tmp_path: Path) -> None:
    kernels = clock_trace([[1e-3], [1e-3]])
    with pytest.raises(HarnessDataError, match="3 ovsim_clock_probe kernels in the trace, 2 probe records"):
        clock_points(kernels, read_clock_probes(probe_file(tmp_path, [1.9e9, 1.7e9])))
