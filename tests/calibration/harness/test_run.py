"""The parts of calibration/harness/run.py that need no GPU: the occupancy-shaping paddings and the
power log's layout. run.py imports PyTorch, CuPy and NVML only when it measures."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from run import Harness, PowerSampler

from ovsim.hw.spec import load_gpu
from ovsim.models.cost import blocks_per_sm
from ovsim.models.ir import BlockShape
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


def test_power_log_is_nvidia_smi_csv_that_ovsim_reads(tmp_path: Path) -> None:
    s = object.__new__(PowerSampler)
    s.path, s.index, s.instant = tmp_path / "power.csv", 0, True
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
    from run import CHANNEL_MIN_REGISTERS, HERE

    r = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-O3", "--resource-usage", str(HERE / "kernels.cu"),
                        "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True, check=True)
    report = r.stdout + r.stderr
    used = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", report, re.S))
    assert {k: int(v) for k, v in used.items()}.keys() == {"ovsim_channel_copy", "ovsim_channel_reduce",
                                                           "ovsim_probe_first", "ovsim_probe_second",
                                                           "ovsim_gemm_tile64"}
    assert int(used["ovsim_channel_copy"]) >= CHANNEL_MIN_REGISTERS
    assert int(used["ovsim_channel_reduce"]) >= CHANNEL_MIN_REGISTERS
    assert int(used["ovsim_gemm_tile64"]) == GEMM64.num_regs
    assert f"{GEMM64.shared_size_bytes} bytes smem" in report
    assert not re.search(r"[1-9]\d* bytes spill", report)
