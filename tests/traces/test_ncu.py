"""Nsight Compute ``--csv --page raw`` import and its join onto the kernel table.

No public ncu CSVs were available, so the fixtures follow the documented layout (Nsight Compute CLI
docs, https://docs.nvidia.com/nsight-compute/NsightComputeCli/index.html, and a public test fixture):
the identifier columns ``ID`` .. ``CC`` then one column per raw metric, a units row with the
identifier columns empty, one row per profiled launch. Metric names are the Profiling Guide's
(https://docs.nvidia.com/nsight-compute/ProfilingGuide/index.html); value formats (thousands
separators, ``n/a``, the European-locale ``27.595.520``) as public fixtures show them. Units in
fixtures/ncu_raw.csv are ncu's base units, which ``--csv`` implies (``ncu --help``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ovsim.errors import OvsimError
from ovsim.traces.ncu import COLUMNS, MEASURED, join_ncu, load_ncu_csv, short_name_key
from ovsim.traces.table import make_table

FIXTURES = Path(__file__).parent / "fixtures"
GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn"
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
       "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"

# Section 2.3's example, verbatim.
DOC_EXAMPLE = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","gpu__time_duration.sum","launch__registers_per_thread"\n'
    '"","","","","","","","","","","","us",""\n'
    '"0","108","two_kernels","127.0.0.1","saxpy(int, float, float *, float *)","1","7","(256, 1, 1)",'
    '"(4096, 1, 1)","0","8.9","12.5","32"\n')


def write(tmp_path: Path, text: str, name: str = "ncu.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_doc_example(tmp_path: Path) -> None:
    df = load_ncu_csv(write(tmp_path, DOC_EXAMPLE))
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 1
    row = df.iloc[0]
    assert row["name"] == "saxpy(int, float, float *, float *)"
    assert (row["id"], row["process_id"], row["stream"], row["device"], row["cc"]) == (0, 108, 7, 0, "8.9")
    assert (row["grid_x"], row["grid_y"], row["block_x"]) == (4096, 1, 256)
    assert row["registers_per_thread"] == 32
    assert row["ncu_duration_s"] == pytest.approx(12.5e-6)  # "us" in the units row
    assert pd.isna(row["shared_mem_bytes"])
    assert np.isnan(row["sm_throughput_pct"])  # not collected


def test_fixture_metrics_and_units() -> None:
    df = load_ncu_csv(FIXTURES / "ncu_raw.csv")
    assert len(df) == 6
    gemm = df.iloc[0]
    assert gemm["name"] == GEMM
    assert gemm["ncu_duration_s"] == pytest.approx(9.85e-6)  # "9,850" nsecond
    assert gemm["dram_bytes_read"] == 12_582_912
    assert gemm["dram_bytes_write"] == 4_194_304
    assert gemm["shared_mem_bytes"] == 49_152  # dynamic 49,152 + static 0 byte/block
    assert gemm["registers_per_thread"] == 168
    assert (gemm["blocks"], gemm["threads_per_block"]) == (108, 256)
    assert gemm["sm_throughput_pct"] == pytest.approx(85.3)
    assert gemm["dram_throughput_pct"] == pytest.approx(45.12)
    assert gemm["memory_throughput_pct"] == pytest.approx(52.3)
    assert gemm["achieved_occupancy_pct"] == pytest.approx(12.4)
    assert gemm["theoretical_occupancy_pct"] == pytest.approx(12.5)
    assert gemm["tensor_pipe_pct"] == pytest.approx(71.2)
    assert gemm["l2_throughput_pct"] == pytest.approx(38.4)
    assert gemm["waves_per_sm"] == pytest.approx(0.82)
    reduce = df.iloc[5]
    assert (reduce["grid_x"], reduce["grid_y"], reduce["grid_z"]) == (16, 8, 1)
    assert np.isnan(reduce["tensor_pipe_pct"])  # "n/a"


def test_scaled_units_and_european_numbers(tmp_path: Path) -> None:
    text = ('"ID","Kernel Name","Block Size","Grid Size","dram__bytes_read.sum","gpu__time_duration.sum",'
            '"launch__shared_mem_per_block_static","sm__throughput.avg.pct_of_peak_sustained_elapsed"\n'
            '"","","","","byte","msecond","Kbyte/block","%"\n'
            '"0","k","(32, 1, 1)","(1, 1, 1)","27.595.520","1,5","2,048","12,5"\n')
    row = load_ncu_csv(write(tmp_path, text)).iloc[0]
    assert row["dram_bytes_read"] == 27_595_520
    assert row["ncu_duration_s"] == pytest.approx(1.5e-3)
    assert row["shared_mem_bytes"] == 2048
    assert row["sm_throughput_pct"] == pytest.approx(12.5)


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(OvsimError) as e:
        load_ncu_csv(tmp_path / "nope.csv")
    assert e.value.field == "path"

    no_units = DOC_EXAMPLE.replace('"","","","","","","","","","","","us",""\n', "")
    with pytest.raises(OvsimError) as e:
        load_ncu_csv(write(tmp_path, no_units))
    assert e.value.field == "units"

    details = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
               '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n'
               '"0","19963","python","127.0.0.1","saxpy","1","7","(256, 1, 1)","(16384, 1, 1)","0","8.0",'
               '"GPU Speed Of Light Throughput","Duration","usecond","211.94"\n')
    with pytest.raises(OvsimError, match="--page raw") as e:
        load_ncu_csv(write(tmp_path, details))
    assert e.value.field == "header"

    with pytest.raises(OvsimError) as e:
        load_ncu_csv(write(tmp_path, "Kernel,Time\nsaxpy,12\n"))
    assert e.value.field == "header"

    garbled = DOC_EXAMPLE.replace('"12.5","32"', '"twelve","32"')
    with pytest.raises(OvsimError) as e:
        load_ncu_csv(write(tmp_path, garbled))
    assert (e.value.field, e.value.source) == ("gpu__time_duration.sum", str(tmp_path / "ncu.csv"))
    assert "line 3" in e.value.message

    odd_unit = DOC_EXAMPLE.replace('"us",""', '"fortnight",""')
    with pytest.raises(OvsimError, match="unknown unit"):
        load_ncu_csv(write(tmp_path, odd_unit))

    bad_tuple = DOC_EXAMPLE.replace('"(256, 1, 1)"', '"256x1x1"')
    with pytest.raises(OvsimError) as e:
        load_ncu_csv(write(tmp_path, bad_tuple))
    assert e.value.field == "Block Size"


def kernel_table() -> pd.DataFrame:
    """Rank 0: three GEMMs (listed out of launch order), one add whose launch configuration the trace
    did not record, an NCCL kernel and a copy; rank 1: one GEMM."""
    na = pd.NA
    rows = [
        # rank, stream, corr, name, start, launch, grid_x, block_x
        (0, 7, 5, GEMM, 30e-6, 3e-6, 108, 256),
        (0, 7, 1, GEMM, 10e-6, 1e-6, 108, 256),
        (0, 7, 3, GEMM, 20e-6, 2e-6, 108, 256),
        (0, 7, 7, ADD, 40e-6, 4e-6, na, na),
        (0, 13, 9, NCCL, 15e-6, 1.5e-6, 2, 640),
        (0, 7, 11, "Memcpy HtoD (Pinned -> Device)", 50e-6, 5e-6, na, na),
        (1, 7, 1, GEMM, 10e-6, 1e-6, 108, 256),
    ]
    cols = list(zip(*rows, strict=True))
    yz = [1 if g is not na else na for g in cols[6]]
    return make_table({"rank": cols[0], "stream": cols[1], "correlation": cols[2], "name": cols[3],
                       "start_s": cols[4], "duration_s": [1e-5] * len(rows), "launch_s": cols[5],
                       "grid_x": cols[6], "grid_y": yz, "grid_z": yz, "block_x": cols[7], "block_y": yz,
                       "block_z": yz})


def test_join_by_launch_and_by_median() -> None:
    k = kernel_table()
    assert k["registers_per_thread"].isna().all()
    j = join_ncu(k, load_ncu_csv(FIXTURES / "ncu_raw.csv"))
    assert len(j) == len(k)
    assert set(MEASURED) <= set(j.columns)
    # Rank 0 GEMMs: same count as ncu, so the k-th launch (by launch_s) takes the k-th ncu row.
    gemm0 = j.loc[(j["rank"] == 0) & (j["name"] == GEMM)].sort_values("launch_s")
    assert list(gemm0["ncu_match"]) == ["launch"] * 3
    assert gemm0["ncu_duration_s"].tolist() == pytest.approx([9.85e-6, 9.9e-6, 10.1e-6])
    assert gemm0["sm_throughput_pct"].tolist() == pytest.approx([85.3, 85.0, 86.1])
    assert (gemm0["registers_per_thread"] == 168).all() and (gemm0["shared_mem_bytes"] == 49152).all()
    # Rank 1 has one GEMM against three ncu rows: the median.
    gemm1 = j.loc[(j["rank"] == 1)].iloc[0]
    assert gemm1["ncu_match"] == "median"
    assert gemm1["ncu_duration_s"] == pytest.approx(9.9e-6)
    # The add had no launch configuration: matched by name (one launch, two ncu rows: median), and filled.
    add = j.loc[j["name"] == ADD].iloc[0]
    assert add["ncu_match"] == "median"
    assert add["ncu_duration_s"] == pytest.approx(720e-9)
    assert (add["grid_x"], add["grid_y"], add["block_x"], add["registers_per_thread"]) == (4096, 1, 128, 16)
    # Not profiled, and not a kernel.
    assert j.loc[j["name"] == NCCL, "ncu_match"].iloc[0] == ""
    assert np.isnan(j.loc[j["name"] == NCCL, "ncu_duration_s"].iloc[0])
    assert j.loc[j["kind"] == "copy", "ncu_match"].iloc[0] == ""
    assert j.attrs["ncu"] == {"matched_by_launch": 3, "matched_by_median": 2, "unmatched_kernels": 1,
                              "unused_ncu_rows": 1}


def test_join_keeps_known_values_and_needs_matching_config() -> None:
    k = kernel_table()
    k.loc[k["correlation"] == 1, "registers_per_thread"] = 200
    k.loc[(k["rank"] == 1), "grid_x"] = 54  # a different launch configuration from anything ncu profiled
    j = join_ncu(k, load_ncu_csv(FIXTURES / "ncu_raw.csv"))
    assert j.loc[(j["rank"] == 0) & (j["correlation"] == 1), "registers_per_thread"].iloc[0] == 200
    assert j.loc[j["rank"] == 1, "ncu_match"].iloc[0] == ""


def test_join_with_function_base_names() -> None:
    """``--print-kernel-base function`` prints bare function names; they match by base name."""
    ncu = load_ncu_csv(FIXTURES / "ncu_raw.csv")
    ncu["name"] = [short_name_key(n) for n in ncu["name"]]
    assert ncu["name"].iloc[3] == "vectorized_elementwise_kernel"
    assert ncu["name"].iloc[5] == "splitKreduce_kernel"
    j = join_ncu(kernel_table(), ncu)
    assert j.loc[j["name"] == ADD, "ncu_match"].iloc[0] == "median"
    assert (j.loc[(j["rank"] == 0) & (j["name"] == GEMM), "ncu_match"] == "launch").all()


def test_short_name_key() -> None:
    assert short_name_key(ADD) == "vectorized_elementwise_kernel"
    assert short_name_key("void (anonymous namespace)::softmax_warp_forward<float, 4>(float*, int)") == (
        "softmax_warp_forward")
    assert short_name_key(GEMM) == GEMM
