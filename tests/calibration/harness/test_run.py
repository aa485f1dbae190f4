"""The parts of calibration/harness/run.py (and the harness_*.py modules it assembles) that need no
GPU: the occupancy-shaping paddings, the GEMM list, the power log, the run folder's preparation and
the tools' lookup. run.py imports PyTorch, CuPy and NVML only when it measures."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness_common import (
    VICTIM_GEMMS,
    PowerSampler,
    find_tool,
    ncu_has_table,
    nvml_handle,
    prepare_out,
    shape_grid,
    share_plan,
)
from run import Harness, _fractions, _gemm_shapes

from ovsim.hw.spec import load_gpu
from ovsim.models.ir import BlockShape
from ovsim.models.occupancy import blocks_per_sm
from ovsim.traces.power import read_power_samples

# ovsim_gemm_tile64 as nvcc 13.0 builds it for sm_80 and sm_90 (--resource-usage): 80 registers,
# 19456 B of static shared memory, 128 threads.
GEMM64 = SimpleNamespace(num_regs=80, shared_size_bytes=19456)


@pytest.mark.parametrize("gpu_name", ["a100-sxm4-40gb", "h100-sxm5-80gb"])
def test_shaping_paddings_give_each_occupancy_by_ovsims_calculator(gpu_name: str) -> None:
    gpu = load_gpu(gpu_name)
    h = object.__new__(Harness)
    h.kernels = {"ovsim_gemm_tile64": GEMM64}
    h.rt = {"regsPerMultiprocessor": gpu.sm.registers_per_sm, "maxThreadsPerMultiProcessor": gpu.sm.max_threads_per_sm}
    h.smem_per_sm = gpu.sm.shared_mem_per_sm_bytes
    plan = h.shaping_paddings()
    # The padding the harness picks for each target, checked by ovsim's own occupancy calculator
    # (CUDA's rules: threads, 256-register warp units, shared memory with 1 KB reserved per block).
    measured = [blocks_per_sm(BlockShape(threads=128, registers_per_thread=80,
                                         shared_mem_bytes=GEMM64.shared_size_bytes + pad), gpu) for _, pad in plan]
    assert measured == [occ for occ, _ in plan]
    assert [occ for occ, _ in plan] == list(range(plan[0][0], 0, -1)) and plan[0] == (6, 0)


def sampler(path: Path, instant: bool = True) -> PowerSampler:
    """A PowerSampler without NVML: rows are set by hand, as its thread would append them."""
    s = object.__new__(PowerSampler)
    s.path, s.index, s.instant, s.rows = path, 0, instant, []
    return s


def test_power_log_is_nvidia_smi_csv_that_ovsim_reads(tmp_path: Path) -> None:
    s = sampler(tmp_path / "power.csv")
    t0 = 1_764_028_800_000_000_000  # 2025-11-25 00:00:00 UTC
    s.rows = [(t0, 120.5, 100.0, 1980.0, 2619.0), (t0 + 5_000_000, 310.25, 101.0, 1755.0, 2619.0)]
    s.write()
    df = read_power_samples(s.path)
    assert df["power_w"].tolist() == [120.5, 310.25]  # the instantaneous reading
    assert read_power_samples(tmp_path / "power_average.csv")["power_w"].tolist() == [100.0, 101.0]
    assert df["sm_clock_hz"].tolist() == [1980e6, 1755e6]
    assert df["time_s"].tolist() == pytest.approx([0.0, 0.005])
    # UTC wall clock to the microsecond, for alignment with the trace's baseTimeNanoseconds.
    assert df["wall_time_s"].iloc[0] == pytest.approx(t0 / 1e9, abs=1e-6)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_build_with_the_footprints_the_harness_assumes(arch: str, tmp_path: Path) -> None:
    """nvcc's resource report for kernels.cu: the channel kernels near NCCL's 96 registers, the GEMM
    as GEMM64 above, nothing spilled. Needs nvcc (skipped without it); the harness checks the same
    on the GPU's machine and records the counts in its manifest."""
    import re
    import shutil
    import subprocess

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    from harness_common import CHANNEL_MIN_REGISTERS, HERE, WMMA_TILE_KERNELS

    r = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-O3", "--resource-usage", str(HERE / "kernels.cu"),
                        "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True, check=True)
    report = r.stdout + r.stderr
    used = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", report, re.S))
    assert {k: int(v) for k, v in used.items()}.keys() == {"ovsim_channel_copy", "ovsim_channel_reduce",
                                                           "ovsim_channel_poll",
                                                           "ovsim_probe_first", "ovsim_probe_second",
                                                           "ovsim_gemm_tile64", "ovsim_clock_probe",
                                                           *(k[0] for k in WMMA_TILE_KERNELS)}
    assert int(used["ovsim_channel_copy"]) >= CHANNEL_MIN_REGISTERS
    assert int(used["ovsim_channel_reduce"]) >= CHANNEL_MIN_REGISTERS
    assert int(used["ovsim_gemm_tile64"]) == GEMM64.num_regs
    assert f"{GEMM64.shared_size_bytes} bytes smem" in report
    assert not re.search(r"[1-9]\d* bytes spill", report)
    # The 64x64 tile of the tiles' template is the study's kernel: the same registers and memory.
    assert used["ovsim_gemm_wmma_64x64_w4"] == used["ovsim_gemm_tile64"]


def test_power_log_is_written_as_it_grows_and_continued_by_a_second_run(tmp_path: Path) -> None:
    """The sampler appends about once a second (a run killed by a time limit keeps its samples), a
    sample without a reading is left out rather than written as nan, and a second run into the same
    folder continues the files instead of replacing the first run's samples."""
    t0 = 1_764_028_800_000_000_000
    s = sampler(tmp_path / "power.csv")
    s.rows.append((t0, 120.0, 100.0, 1980.0, 2619.0))
    s.write()
    s.rows += [(t0 + 5_000_000, float("nan"), 101.0, 1980.0, 2619.0), (t0 + 10_000_000, 130.0, 102.0, 1980.0, 2619.0)]
    s.write()
    s.write()  # nothing new: nothing written twice
    assert read_power_samples(tmp_path / "power.csv")["power_w"].tolist() == [120.0, 130.0]
    assert read_power_samples(tmp_path / "power_average.csv")["power_w"].tolist() == [100.0, 101.0, 102.0]
    second = sampler(tmp_path / "power.csv")
    second.rows.append((t0 + 60_000_000_000, 300.0, 280.0, 1980.0, 2619.0))
    second.write()
    df = read_power_samples(tmp_path / "power.csv")
    assert df["power_w"].tolist() == [120.0, 130.0, 300.0]
    assert (tmp_path / "power.csv").read_text().count("timestamp") == 1
    # A driver without the instantaneous field: one file, NVML's average under nvidia-smi's name.
    avg = sampler(tmp_path / "other" / "power.csv", instant=False)
    (tmp_path / "other").mkdir()
    avg.rows.append((t0, float("nan"), 99.5, 1980.0, 2619.0))
    avg.write()
    assert "power.draw [W]" in (tmp_path / "other" / "power.csv").read_text()
    assert read_power_samples(tmp_path / "other" / "power.csv")["power_w"].tolist() == [99.5]
    assert not (tmp_path / "other" / "power_average.csv").exists()


def harness(cc: tuple[int, int], quick: bool) -> Harness:
    h = object.__new__(Harness)
    h.cc, h.quick = cc, quick
    return h


@pytest.mark.parametrize("quick", [True, False])
def test_gemm_list_holds_the_victims_and_fp8_only_where_the_gpu_has_it(quick: bool) -> None:
    hopper, ampere = harness((9, 0), quick).gemm_specs(), harness((8, 0), quick).gemm_specs()
    labels = [spec[0] for spec in hopper]
    assert len(labels) == len(set(labels))
    assert set(VICTIM_GEMMS) <= set(labels)
    assert set(VICTIM_GEMMS) - {spec[0] for spec in ampere} == {"gemm_fp8_8192x8192x8192"}
    assert not any(dname == "fp8" for *_, dname in ampere)
    for label, m, n, k, dname in hopper:
        assert label == f"gemm_{dname}_{m}x{n}x{k}"
        # _scaled_mm and the GEMMs' tiles want multiples of 16
        assert m % 16 == 0 and n % 16 == 0 and k % 16 == 0
    if quick:
        # 10 shapes x (bf16, fp16, fp8) and tf32 for the 8 no larger than 8192^3
        assert len(labels) == 38 and not any(m == 16384 for _, m, *_ in hopper)


def test_a_part_run_again_into_the_same_folder_replaces_its_earlier_experiments(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "dispatch").mkdir(parents=True)
    (out / "dispatch" / "experiments.jsonl").write_text('{"label": "probe", "part": "dispatch"}\n')
    (out / "gemm").mkdir()
    (out / "gemm" / "experiments.jsonl").write_text('{"label": "g", "part": "gemm"}\n')
    (out / "manifest.json").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3",
                                                   "parts": {"gemm": {"seconds": 60.0}, "dispatch": {"seconds": 5.0}}}))
    earlier = prepare_out(out, "NVIDIA H100 80GB HBM3", ["dispatch", "copy"])
    assert earlier == {"gemm": {"seconds": 60.0}}  # kept in the new manifest; dispatch runs again
    assert not (out / "dispatch").exists() and (out / "gemm" / "experiments.jsonl").is_file()
    with pytest.raises(SystemExit, match="holds a run on NVIDIA H100 80GB HBM3, not NVIDIA H200"):
        prepare_out(out, "NVIDIA H200", ["copy"])
    # A manifest cut short by a kill is not a reason to stop.
    (out / "manifest.json").write_text('{"gpu": "NVI')
    assert prepare_out(out, "NVIDIA H200", ["copy"]) == {}
    assert prepare_out(tmp_path / "fresh", "NVIDIA H200", ["gemm"]) == {}
    # A folder the harness did not write is never removed.
    (out / "power").mkdir()
    (out / "power" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not a harness part's folder"):
        prepare_out(out, "NVIDIA H200", ["power"])
    assert (out / "power" / "notes.txt").is_file()


def test_tools_are_found_off_path_and_nvml_goes_by_pci_bus_id(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "nvcc").write_text("#!/bin/sh\n")
    (bin_dir / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert find_tool("nvcc") == str(bin_dir / "nvcc")
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    if not os.path.exists("/usr/local/cuda/bin/nvcc"):
        assert find_tool("nvcc") is None

    calls: list[tuple[str, object]] = []

    class Nvml:
        @staticmethod
        def nvmlDeviceGetHandleByPciBusId(bus: str) -> str:
            calls.append(("bus", bus))
            if bus == "bad":
                raise RuntimeError("NVML_ERROR_NOT_FOUND")
            return f"gpu@{bus}"

        @staticmethod
        def nvmlDeviceGetHandleByIndex(i: int) -> str:
            calls.append(("index", i))
            return f"gpu#{i}"

    # CUDA device 0 of a process that sees only the machine's fourth GPU is NVML's GPU 3: by bus id.
    assert nvml_handle(Nvml, 0, "0000:9B:00.0") == "gpu@0000:9B:00.0"
    assert nvml_handle(Nvml, 0, "bad") == "gpu#0"
    assert nvml_handle(Nvml, 0, None) == "gpu#0"


def test_ncu_output_is_recognized_only_with_its_table(tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_text('==PROF== Connected to process 12\n"ID","Process ID","Kernel Name"\n"","",""\n"0","12","k"\n')
    bad = tmp_path / "bad.csv"
    bad.write_text("==PROF== Connected to process 12\n==ERROR== Failed to find metric x\n")
    assert ncu_has_table(good) and not ncu_has_table(bad) and not ncu_has_table(tmp_path / "missing.csv")


@pytest.mark.parametrize("share", Harness.CLOCK_GEMM_SHARES)
def test_share_plans_hit_their_gemm_share_inside_the_cycle(share: float) -> None:
    """With the H100 clock part's own sizing times (8192^3 BF16 GEMM 1.41 ms, streaming add 0.54 ms,
    calibration/data/h100-sxm5-80gb/2026-11-26-d), each alternation's GEMM time share is within 1.5
    points of its target and its cycle fits the bound, far inside the power loop's 70 ms window."""
    gemm_s, add_s = 1.4066e-3, 0.536e-3
    g, n = share_plan(share, gemm_s, add_s, Harness.CLOCK_SHARE_CYCLE_S)
    assert g >= 1 and n >= 1
    assert g * gemm_s / (g * gemm_s + n * add_s) == pytest.approx(share, abs=0.015)
    assert g * gemm_s + n * add_s <= Harness.CLOCK_SHARE_CYCLE_S


def test_a_share_plan_keeps_one_of_each_when_the_gemm_outlasts_the_cycle() -> None:
    assert share_plan(0.5, 0.02, 0.4e-3, 0.015) == (1, 1)
    # Of equally near shares, the shorter cycle: 1 GEMM and 1 add rather than 2 and 2.
    assert share_plan(0.5, 1e-3, 1e-3, 0.015) == (1, 1)


def test_the_shape_grid_runs_each_shape_once_and_its_inputs_fit_any_of_the_gpus() -> None:
    """A shape listed twice in one trace could not be told apart from its repeats; two input sets
    of the largest shape must fit beside the harness's other buffers on a 40 GB A100."""
    grid = shape_grid()
    assert len(grid) == len(set(grid))
    for experiment, dname, batch, m, n, k in grid:
        assert experiment.startswith(dname) and min(batch, m, n, k) >= 1
        element = {"tf32": 4, "fp8": 1}.get(dname, 2)
        assert 2 * element * batch * (m * k + k * n) < 4 * 2**30
        if dname == "fp8":  # torch._scaled_mm's rule
            assert m % 16 == 0 and n % 16 == 0 and k % 16 == 0
    assert {g[0] for g in grid} == {"bf16_linear", "bf16_batched", "tf32_linear", "fp16_linear", "fp8_linear"}
    assert grid[-1][0] == "fp8_linear"  # last, so a GPU that refuses it has run the rest


def test_smloss_options_parse_shapes_and_fractions_and_refuse_malformed_ones() -> None:
    assert _gemm_shapes("2048x6144x2048, 4096X4096x4096") == ((2048, 6144, 2048), (4096, 4096, 4096))
    assert _fractions("1.5,0.4") == (1.5, 0.4)
    for bad in ("2048x6144", "0x1x1", "axbxc", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            _gemm_shapes(bad)
    for bad in ("0", "-1", "x", "", "100"):
        with pytest.raises(argparse.ArgumentTypeError):
            _fractions(bad)


def test_the_ncu_parts_profile_run_py_as_their_subject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ncu runs the harness again as the profiled process: that must be run.py, the entry point,
    not the module the part lives in (which runs nothing: ncu then profiles no kernel)."""
    import subprocess

    import harness_ncu

    commands: list[list[str]] = []

    def fake_run(cmd: list[str], stdout: object, stderr: object) -> SimpleNamespace:
        commands.append(cmd)
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(harness_ncu, "find_tool", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(harness_ncu, "ncu_has_table", lambda path: True)
    h = Harness.__new__(Harness)
    h.out = tmp_path
    h.part_ncu("own_tiles_ncu", "own_tiles")
    cmd = commands[0]
    i = cmd.index("--out")
    assert Path(cmd[i - 1]).name == "run.py" and Path(cmd[i - 1]).is_file()
    assert cmd[cmd.index("--ncu-subject") + 1] == "own_tiles"
