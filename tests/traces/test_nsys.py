"""Nsight Systems importers against hand-built files that follow the documented schemas.

No public .sqlite exports or nsys stats CSVs were available, so the fixtures are built here from the
documented schemas, from these upstream sources:

- SQLite: NVIDIA Post-Collection Analysis Guide, "SQLite Schema Reference", schema 3.28.1
  (nsys 2026.4), https://docs.nvidia.com/nsight-systems/AnalysisGuide/index.html; the older column set
  (no mangledName/greenContextId/graph/cluster/QMD columns, the ENUM_CUDA_KRENEL_LAUNCH_TYPE spelling,
  everything NOT NULL) from the 2021.5 exporter reference
  https://docs.nvidia.com/nsight-systems/2021.5/nsys-exporter/exported_data.html and the doc copy in
  chenyu-jiang/nsys2json:nsys2json.py; GlobalId layout from nsys2json.py and the Guide's "Serialized
  process and thread identifiers" (PID = globalTid / 0x1000000 % 0x1000000); enum values from CUPTI's
  cupti_activity.h.
- CUPTI_ACTIVITY_KIND_SYNCHRONIZATION / CUPTI_ACTIVITY_KIND_CUDA_EVENT: their columns
  follow CUPTI's CUpti_ActivitySynchronization and CUpti_ActivityCudaEvent records
  (https://docs.nvidia.com/cupti/api/structCUpti__ActivitySynchronization.html,
  .../structCUpti__ActivityCudaEvent2.html) as nsys exports them (start, end, deviceId, contextId,
  streamId, correlationId, globalPid, syncType, eventId), the names public nsys-SQLite scripts query;
  syncType values from CUpti_ActivitySynchronizationType (2 = STREAM_WAIT_EVENT).
- ENUM_CUDA_MEMCPY_OPER rows: name ``CUDA_MEMCPY_KIND_DTOH`` as public scripts filter on it, label
  ``Device-to-Host`` as in nsys's own "[CUDA memcpy <label>]" report names.
- cuda_gpu_trace CSV: the Analysis Guide's "cuda_gpu_trace" report; both header variants as public
  test fixtures and parsers quote them (fixtures/cuda_gpu_trace_2026.csv, fixtures/cuda_gpu_trace_2022.csv).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ovsim.errors import OvsimError
from ovsim.traces.nsys import load_nsys_sqlite, rank_from_name
from ovsim.traces.nsys_csv import load_nsys_csv
from ovsim.traces.table import COLUMNS

FIXTURES = Path(__file__).parent / "fixtures"

# -- schemas (the Analysis Guide's KERNEL, MEMCPY/MEMSET, RUNTIME, StringIds/NVTX, TARGET_INFO) -------

KERNEL_3_28 = """CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER,
    cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL,
    gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL,
    staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
    sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER,
    qmdBulkReleaseDone INTEGER, qmdPreexitDone INTEGER, qmdLastCtaDone INTEGER, graphId INTEGER,
    clusterX INTEGER, clusterY INTEGER, clusterZ INTEGER, clusterSchedulingPolicy INTEGER,
    maxPotentialClusterSize INTEGER, maxActiveClusters INTEGER, sharedMemoryRequestedPercentage INTEGER,
    tensorSizeMinusOneElements TEXT NOT NULL)"""

# 2021-era column set, in a different order: no greenContextId, mangledName, graph, cluster or QMD columns.
KERNEL_2021 = """CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    globalPid INTEGER NOT NULL, correlationId INTEGER NOT NULL, start INTEGER NOT NULL, "end" INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL,
    blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, registersPerThread INTEGER NOT NULL,
    staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
    sharedMemoryExecuted INTEGER NOT NULL, graphNodeId INTEGER NOT NULL, sharedMemoryLimitConfig INTEGER NOT NULL,
    launchType INTEGER NOT NULL, cacheConfig INTEGER NOT NULL, demangledName INTEGER NOT NULL,
    shortName INTEGER NOT NULL)"""

MEMCPY_3_28 = """CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
    start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER,
    srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER, migrationCause INTEGER,
    graphNodeId INTEGER, virtualAddress INTEGER, copyCount INTEGER)"""

MEMCPY_2021 = """CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
    start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    streamId INTEGER NOT NULL, correlationId INTEGER NOT NULL, globalPid INTEGER NOT NULL, bytes INTEGER NOT NULL,
    copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER NOT NULL, srcKind INTEGER NOT NULL, dstKind INTEGER NOT NULL,
    srcDeviceId INTEGER NOT NULL, srcContextId INTEGER NOT NULL, dstDeviceId INTEGER NOT NULL,
    dstContextId INTEGER NOT NULL, migrationCause INTEGER NOT NULL, graphNodeId INTEGER NOT NULL)"""

MEMSET_3_28 = """CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (
    start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER)"""

RUNTIME = """CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start INTEGER NOT NULL, "end" INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER,
    correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER)"""

NVTX = """CREATE TABLE NVTX_EVENTS (
    start INTEGER NOT NULL, "end" INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER,
    color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER,
    uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER,
    floatValue REAL, jsonTextId INTEGER, jsonText TEXT)"""

GPU_3_28 = """CREATE TABLE TARGET_INFO_GPU (
    vmId INTEGER, id INTEGER, name TEXT, busLocation TEXT, isDiscrete INTEGER, l2CacheSize INTEGER,
    totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, smCount INTEGER, pwGpuId INTEGER, uuid TEXT,
    luid INTEGER, chipName TEXT, cuDevice INTEGER, ctxswDevPath TEXT, ctrlDevPath TEXT, revision INTEGER,
    nodeMask INTEGER, constantMemory INTEGER, maxIPC INTEGER, maxRegistersPerBlock INTEGER,
    maxShmemPerBlock INTEGER, maxShmemPerBlockOptin INTEGER, maxShmemPerSm INTEGER, maxRegistersPerSm INTEGER,
    threadsPerWarp INTEGER, asyncEngines INTEGER, maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER,
    maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER, maxBlockDimZ INTEGER,
    maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER, computeMajor INTEGER, computeMinor INTEGER,
    smMajor INTEGER, smMinor INTEGER, numaNodeId INTEGER)"""

# The smaller TARGET_INFO_GPU column set public hand-built fixtures use.
GPU_2021 = """CREATE TABLE TARGET_INFO_GPU (id INTEGER NOT NULL, name TEXT NOT NULL, busLocation TEXT NOT NULL,
    totalMemory INTEGER NOT NULL, smCount INTEGER NOT NULL, chipName TEXT NOT NULL, memoryBandwidth INTEGER NOT NULL)"""

SYNC = """CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (
    start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, syncType INTEGER NOT NULL,
    eventId INTEGER NOT NULL)"""

CUDA_EVENT = """CREATE TABLE CUPTI_ACTIVITY_KIND_CUDA_EVENT (
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
    globalPid INTEGER, eventId INTEGER NOT NULL)"""


def enum_table(name: str) -> str:
    return f"CREATE TABLE {name} (id INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, label TEXT NOT NULL)"


def gid(pid: int, tid: int = 0) -> int:
    """A serialized GlobalId (nsys2json.py; the Guide's serialized identifiers): TID in the low 24 bits, PID above."""
    return pid * 0x1000000 + tid


# -- a small run --------------------------------------------------------------------------------------

GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn"
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
       "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
STRINGS = {
    1: GEMM, 2: GEMM, 3: "_Z5gemmv",
    4: ADD, 5: "vectorized_elementwise_kernel", 6: "_ZN2at6native29vectorized_elementwise_kernelILi4E",
    7: NCCL, 8: "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 9: "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
    10: "cudaLaunchKernel_v7000", 11: "cudaEventRecord_v3020", 12: "cudaStreamWaitEvent_v3020",
    13: "cudaMemcpyAsync_v3020", 14: "cudaMemsetAsync_v3020", 20: "rank 5",
}
PID, TID = 4242, 4250
COMPUTE, COMM = 7, 13


def build(path: Path, *, old: bool = False, cuda_events: bool = False, pids: tuple[int, ...] = (PID,),
          nvtx_ranks: dict[int, str] | None = None, mpi_ranks: dict[int, int] | None = None,
          bad_kernel: bool = True) -> Path:
    """A run per process: a GEMM on stream 7, an event record and wait, an NCCL all-reduce on stream 13,
    an add on stream 7 overlapping it, an HtoD copy and a memset, and a kernel whose end precedes its
    start. Times in ns."""
    con = sqlite3.connect(path)
    c = con.cursor()
    c.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    c.executemany("INSERT INTO StringIds VALUES (?, ?)", STRINGS.items())
    c.execute(KERNEL_2021 if old else KERNEL_3_28)
    c.execute(MEMCPY_2021 if old else MEMCPY_3_28)
    if not old:  # tables are created lazily: an old run without memsets has no MEMSET table
        c.execute(MEMSET_3_28)
        c.execute("CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT NOT NULL)")
        c.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.28.1')")
    c.execute(RUNTIME)
    c.execute(NVTX)
    c.execute(GPU_2021 if old else GPU_3_28)
    c.execute(enum_table("ENUM_CUDA_KRENEL_LAUNCH_TYPE" if old else "ENUM_CUDA_KERNEL_LAUNCH_TYPE"))
    c.execute(enum_table("ENUM_CUDA_MEM_KIND"))
    c.executemany("INSERT INTO ENUM_CUDA_MEM_KIND VALUES (?, ?, ?)",
                  [(1, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"), (2, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
                   (3, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device")])
    if not old:
        c.execute(enum_table("ENUM_CUDA_MEMCPY_OPER"))
        c.executemany("INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (?, ?, ?)",
                      [(0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"), (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
                       (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"), (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"),
                       (10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer")])
        c.execute(enum_table("ENUM_CUPTI_SYNC_TYPE"))
        c.executemany("INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES (?, ?, ?)",
                      [(1, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE", "Event synchronize"),
                       (2, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT", "Stream wait event")])
    if old:
        c.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA A100-SXM4-80GB', '0000:07:00.0', 85899345920, "
                  "108, 'GA100', 2039000000000)")
    else:
        c.execute("INSERT INTO TARGET_INFO_GPU (vmId, id, name, cuDevice, smCount, chipName) VALUES "
                  "(0, 0, 'NVIDIA H100 80GB HBM3', 0, 132, 'GH100')")
    if cuda_events:
        c.execute(SYNC)
        c.execute(CUDA_EVENT)
    if mpi_ranks is not None:
        c.execute("CREATE TABLE MPI_RANKS (globalTid INTEGER NOT NULL, rank INTEGER NOT NULL)")
        c.executemany("INSERT INTO MPI_RANKS VALUES (?, ?)", [(gid(p, p), r) for p, r in mpi_ranks.items()])

    def kernel(pid: int, corr: int, start: int, end: int, stream: int, names: tuple[int, int, int],
               grid: tuple[int, int, int], block: tuple[int, int, int], regs: int, smem: tuple[int, int]) -> None:
        row = {"start": start, "end": end, "deviceId": 0, "contextId": 1, "streamId": stream, "correlationId": corr,
               "globalPid": gid(pid), "demangledName": names[0], "shortName": names[1], "registersPerThread": regs,
               "gridX": grid[0], "gridY": grid[1], "gridZ": grid[2], "blockX": block[0], "blockY": block[1],
               "blockZ": block[2], "staticSharedMemory": smem[0], "dynamicSharedMemory": smem[1],
               "localMemoryPerThread": 0, "localMemoryTotal": 0, "gridId": corr}
        if old:
            row.update(sharedMemoryExecuted=0, graphNodeId=0, sharedMemoryLimitConfig=0, launchType=0, cacheConfig=0)
        else:
            row.update(mangledName=names[2], tensorSizeMinusOneElements="")
        c.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({', '.join(f'[{k}]' for k in row)}) "
                  f"VALUES ({', '.join('?' * len(row))})", list(row.values()))

    def call(pid: int, corr: int, start: int, end: int, name_id: int) -> None:
        c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, ?, 0, NULL)",
                  (start, end, gid(pid, TID if pid == PID else pid), corr, name_id))

    for n, pid in enumerate(pids):
        off = n * 100_000
        call(pid, 101, 1_000 + off, 1_500 + off, 10)
        kernel(pid, 101, 2_000 + off, 12_000 + off, COMPUTE, (1, 2, 3), (108, 1, 1), (256, 1, 1), 168, (0, 49152))
        call(pid, 102, 1_600 + off, 1_700 + off, 11)
        call(pid, 103, 1_800 + off, 1_900 + off, 12)
        call(pid, 104, 2_000 + off, 2_400 + off, 10)
        kernel(pid, 104, 12_100 + off, 30_000 + off, COMM, (7, 8, 9), (2, 1, 1), (640, 1, 1), 96, (5000, 0))
        call(pid, 105, 2_500 + off, 2_900 + off, 10)
        kernel(pid, 105, 12_050 + off, 13_000 + off, COMPUTE, (4, 5, 6), (4096, 1, 1), (128, 1, 1), 16, (0, 0))
        call(pid, 106, 3_000 + off, 3_200 + off, 13)
        memcpy = {"start": 13_100 + off, "end": 15_000 + off, "deviceId": 0, "contextId": 1, "streamId": COMPUTE,
                  "correlationId": 106, "globalPid": gid(pid), "bytes": 1 << 20, "copyKind": 1, "srcKind": 2,
                  "dstKind": 3, "deprecatedSrcId": 0, "srcDeviceId": 0, "srcContextId": 0, "dstDeviceId": 0,
                  "dstContextId": 0, "migrationCause": 0, "graphNodeId": 0}
        c.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY ({', '.join(f'[{k}]' for k in memcpy)}) "
                  f"VALUES ({', '.join('?' * len(memcpy))})", list(memcpy.values()))
        if not old:
            call(pid, 107, 3_300 + off, 3_400 + off, 14)
            c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET (start, \"end\", deviceId, contextId, streamId, "
                      "correlationId, globalPid, value, bytes, memKind) VALUES (?, ?, 0, 1, ?, 107, ?, 0, 4096, 3)",
                      (15_100 + off, 15_500 + off, COMPUTE, gid(pid)))
        if bad_kernel:
            call(pid, 108, 3_500 + off, 3_600 + off, 10)
            kernel(pid, 108, 16_000 + off, 15_900 + off, COMPUTE, (4, 5, 6), (1, 1, 1), (32, 1, 1), 16, (0, 0))
        if cuda_events:
            c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_CUDA_EVENT VALUES (0, 1, ?, 102, ?, 5)", (COMPUTE, gid(pid)))
            c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (?, ?, 0, 1, ?, 103, ?, 2, 5)",
                      (1_800 + off, 1_900 + off, COMM, gid(pid)))
            # A wait on an event recorded before the capture started, and an event synchronize (not a wait).
            c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (?, ?, 0, 1, ?, 109, ?, 2, 6)",
                      (3_700 + off, 3_800 + off, COMPUTE, gid(pid)))
            c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (?, ?, 0, 1, ?, 110, ?, 1, 5)",
                      (3_900 + off, 4_000 + off, COMPUTE, gid(pid)))
        if nvtx_ranks and pid in nvtx_ranks:
            c.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, text, globalTid) VALUES (?, NULL, 34, ?, ?)",
                      (500 + off, nvtx_ranks[pid], gid(pid, pid)))
        c.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, textId, globalTid) VALUES (?, ?, 59, 20, ?)"
                  if nvtx_ranks is None else
                  "INSERT INTO NVTX_EVENTS (start, \"end\", eventType, text, globalTid) VALUES (?, ?, 59, 'fwd', ?)",
                  (900 + off, 40_000 + off, gid(pid, pid)))
    con.commit()
    con.close()
    return path


@pytest.fixture
def nsys_db(tmp_path: Path) -> Path:
    return build(tmp_path / "report.sqlite")


# -- SQLite --------------------------------------------------------------------------------------------

def test_sqlite_reads_kernels_copies_and_memsets(nsys_db: Path) -> None:
    b = load_nsys_sqlite(nsys_db)
    k = b.kernels
    assert list(k.columns) == list(COLUMNS)
    assert len(k) == 5
    assert b.skipped == {"negative duration": 1}
    # The NVTX range text "rank 5" names this process's rank (a whole-text "rank N" mark).
    assert set(k["rank"]) == {5}
    assert b.sources == {5: str(nsys_db)}
    assert b.gpu_names == {5: "NVIDIA H100 80GB HBM3"}
    gemm = k.loc[k["name"] == GEMM].iloc[0]
    assert gemm["kind"] == "gemm"
    assert gemm["start_s"] == pytest.approx(2e-6)
    assert gemm["duration_s"] == pytest.approx(10e-6)
    assert gemm["launch_s"] == pytest.approx(1e-6)
    assert (gemm["grid_x"], gemm["block_x"], gemm["registers_per_thread"]) == (108, 256, 168)
    assert gemm["shared_mem_bytes"] == 49152
    assert (gemm["stream"], gemm["correlation"], gemm["device"]) == (COMPUTE, 101, 0)
    # The demangled name is preferred over the short and mangled ones.
    assert ADD in set(k["name"])
    nccl = k.loc[k["kind"] == "collective"].iloc[0]
    assert nccl["name"] == NCCL
    assert (nccl["collective"], nccl["algorithm"], nccl["protocol"], nccl["dtype"]) == (
        "all_reduce", "ring", "LL", "bfloat16")
    assert nccl["shared_mem_bytes"] == 5000
    copy = k.loc[k["kind"] == "copy"].iloc[0]
    assert copy["name"] == "Memcpy HtoD (Pinned -> Device)"
    assert copy["copy_kind"] == "HtoD"
    assert copy["bytes"] == float(1 << 20)
    assert copy["launch_s"] == pytest.approx(3e-6)
    memset = k.loc[k["kind"] == "memset"].iloc[0]
    assert memset["name"] == "Memset (Device)"
    assert memset["bytes"] == 4096.0
    assert list(k["start_s"]) == sorted(k["start_s"])


def test_sqlite_wall_clock_of_the_session_start(nsys_db: Path) -> None:
    """The session timeline's 0 is TARGET_INFO_SESSION_START_TIME.utcEpochNs (the Analysis Guide's
    SQLite Schema Reference); an export without that table has no wall clock, and two disagreeing rows none."""
    assert load_nsys_sqlite(nsys_db).wall_origin_s is None
    con = sqlite3.connect(nsys_db)
    con.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT)")
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1790000000123456789, 'x', 'y')")
    con.commit()
    origin = load_nsys_sqlite(nsys_db).wall_origin_s
    assert origin == pytest.approx(1790000000.123456789, abs=1e-6)
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1790000009000000000, 'x', 'y')")
    con.commit()
    con.close()
    assert load_nsys_sqlite(nsys_db).wall_origin_s is None


def test_sqlite_syncs_inferred_from_runtime_calls(nsys_db: Path) -> None:
    """Without CUPTI sync/event records the runtime table has no stream column (CUPTI_ACTIVITY_KIND_RUNTIME): the
    record is the thread's latest cudaEventRecord before the wait, the recorded activity the one it
    launched last before that, the waiting stream the one it launches on next."""
    s = load_nsys_sqlite(nsys_db).syncs
    assert s is not None
    assert list(s.columns) == ["rank", "waiting_stream", "waiting_after_s", "recorded_correlation", "inferred"]
    assert len(s) == 1
    row = s.iloc[0]
    assert (row["rank"], row["waiting_stream"], row["recorded_correlation"]) == (5, COMM, 101)
    assert row["waiting_after_s"] == pytest.approx(1.8e-6)
    assert bool(row["inferred"])


def test_sqlite_syncs_from_cupti_event_records(tmp_path: Path) -> None:
    b = load_nsys_sqlite(build(tmp_path / "r.sqlite", cuda_events=True))
    s = b.syncs
    assert s is not None and len(s) == 1
    row = s.iloc[0]
    assert (row["waiting_stream"], row["recorded_correlation"]) == (COMM, 101)
    assert row["waiting_after_s"] == pytest.approx(1.8e-6)
    assert not bool(row["inferred"])
    assert b.skipped["sync: wait on an event recorded before the trace"] == 1


def test_sqlite_older_schema(tmp_path: Path) -> None:
    """2021-era export: other column order, no mangledName/greenContextId, misspelt enum table, no
    MEMSET table and no ENUM_CUDA_MEMCPY_OPER (CUPTI's copyKind values are used)."""
    b = load_nsys_sqlite(build(tmp_path / "old.sqlite", old=True))
    k = b.kernels
    assert len(k) == 4
    assert set(k["kind"]) == {"gemm", "collective", "elementwise", "copy"}
    assert k.loc[k["kind"] == "copy", "name"].iloc[0] == "Memcpy HtoD (Pinned -> Device)"
    assert b.gpu_names == {5: "NVIDIA A100-SXM4-80GB"}
    assert k.loc[k["name"] == GEMM, "shared_mem_bytes"].iloc[0] == 49152


def test_sqlite_processes_numbered_by_pid(tmp_path: Path) -> None:
    b = load_nsys_sqlite(build(tmp_path / "both.sqlite", pids=(300, 200), nvtx_ranks={}, bad_kernel=False))
    k = b.kernels
    assert b.world_size == 2
    # Correlation ids repeat across processes: each launch is joined within its own process.
    for r, off in ((0, 100_000), (1, 0)):
        rows = k.loc[k["rank"] == r]
        assert len(rows) == 5
        assert rows.loc[rows["name"] == GEMM, "launch_s"].iloc[0] == pytest.approx((1_000 + off) * 1e-9)
    assert set(b.gpu_names) == {0, 1}
    s = b.syncs
    assert s is not None and sorted(s["rank"]) == [0, 1]


def test_sqlite_ranks_from_nvtx_and_mpi(tmp_path: Path) -> None:
    b = load_nsys_sqlite(build(tmp_path / "a.sqlite", pids=(300, 200), nvtx_ranks={300: "rank 0", 200: "rank=1"}))
    k = b.kernels
    assert k.loc[k["rank"] == 0, "start_s"].min() == pytest.approx(2e-6)
    assert k.loc[k["rank"] == 1, "start_s"].min() == pytest.approx(102e-6)
    b = load_nsys_sqlite(build(tmp_path / "m.sqlite", pids=(300, 200), nvtx_ranks={}, mpi_ranks={300: 7, 200: 3}))
    assert sorted(set(b.kernels["rank"])) == [3, 7]
    assert b.world_size is None
    assert b.kernels.loc[b.kernels["rank"] == 7, "start_s"].min() == pytest.approx(2e-6)


def test_sqlite_rank_from_file_name_and_argument(tmp_path: Path) -> None:
    p = build(tmp_path / "train_rank3.sqlite", nvtx_ranks={})
    assert set(load_nsys_sqlite(p).kernels["rank"]) == {3}
    assert set(load_nsys_sqlite(p, rank=6).kernels["rank"]) == {6}
    with pytest.raises(OvsimError) as e:
        load_nsys_sqlite(build(tmp_path / "two.sqlite", pids=(1, 2)), rank=0)
    assert e.value.field == "rank"
    assert rank_from_name("rank12.nsys.sqlite") == 12
    assert rank_from_name("profile_rank_4.csv") == 4
    assert rank_from_name("franky.sqlite") is None


def test_sqlite_activity_without_process(tmp_path: Path) -> None:
    one = build(tmp_path / "one.sqlite")
    two = build(tmp_path / "two.sqlite", pids=(1, 2), nvtx_ranks={})
    for p in (one, two):
        con = sqlite3.connect(p)
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = NULL WHERE correlationId = 105")
        con.commit()
        con.close()
    b = load_nsys_sqlite(one)
    assert len(b.kernels) == 5 and set(b.kernels["rank"]) == {5}
    assert b.kernels.loc[b.kernels["correlation"] == 105, "launch_s"].iloc[0] == pytest.approx(2.5e-6)
    b = load_nsys_sqlite(two)
    assert len(b.kernels) == 8
    assert b.skipped["activity without a process (globalPid)"] == 2


def test_sqlite_errors(tmp_path: Path) -> None:
    with pytest.raises(OvsimError) as e:
        load_nsys_sqlite(tmp_path / "missing.sqlite")
    assert (e.value.source, e.value.field) == (str(tmp_path / "missing.sqlite"), "path")

    text = tmp_path / "notes.sqlite"
    text.write_text("not a database\n")
    with pytest.raises(OvsimError) as e:
        load_nsys_sqlite(text)
    assert e.value.field == "file" and "not a SQLite database" in e.value.message

    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00\x01binary")
    with pytest.raises(OvsimError, match="nsys export --type sqlite"):
        load_nsys_sqlite(rep)

    empty = tmp_path / "empty.sqlite"
    con = sqlite3.connect(empty)
    con.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    con.close()
    with pytest.raises(OvsimError) as e:
        load_nsys_sqlite(empty)
    assert e.value.field == "CUPTI_ACTIVITY_KIND_KERNEL"

    nostream = tmp_path / "nostream.sqlite"
    con = sqlite3.connect(nostream)
    con.execute(KERNEL_3_28.replace("streamId INTEGER NOT NULL,", ""))
    con.close()
    with pytest.raises(OvsimError) as e:
        load_nsys_sqlite(nostream)
    assert e.value.field == "CUPTI_ACTIVITY_KIND_KERNEL.streamId"
    assert "3.28" not in e.value.message  # no META_DATA_EXPORT in this file

    garbled = build(tmp_path / "garbled.sqlite")
    con = sqlite3.connect(garbled)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE correlationId = 105")
    con.commit()
    con.close()
    with pytest.raises(OvsimError) as e:
        load_nsys_sqlite(garbled)
    assert e.value.field == "CUPTI_ACTIVITY_KIND_KERNEL.start"


def test_sqlite_without_runtime_or_strings_for_copies(tmp_path: Path) -> None:
    p = build(tmp_path / "r.sqlite")
    con = sqlite3.connect(p)
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
    con.execute("DROP TABLE TARGET_INFO_GPU")
    con.commit()
    con.close()
    b = load_nsys_sqlite(p)
    assert np.isnan(b.kernels["launch_s"]).all()
    assert b.syncs is None
    assert b.gpu_names == {}


# -- cuda_gpu_trace CSV ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fixture", ["cuda_gpu_trace_2026.csv", "cuda_gpu_trace_2022.csv"])
def test_csv_both_headers(fixture: str) -> None:
    b = load_nsys_csv(FIXTURES / fixture)
    k = b.kernels
    assert list(k.columns) == list(COLUMNS)
    assert len(k) == 5
    assert b.skipped == {"negative duration": 1}
    assert set(k["rank"]) == {0}
    assert b.gpu_names == {0: "NVIDIA H100 80GB HBM3"}
    gemm = k.loc[k["kind"] == "gemm"].iloc[0]
    assert gemm["start_s"] == pytest.approx(2e-6)
    assert gemm["duration_s"] == pytest.approx(10e-6)
    assert (gemm["grid_x"], gemm["block_x"], gemm["registers_per_thread"], gemm["correlation"]) == (108, 256, 168, 101)
    # The report prints MB with three decimals, so 49152 B of shared memory reads back as 0.049 MB.
    assert gemm["shared_mem_bytes"] == 49000
    assert np.isnan(gemm["launch_s"])
    assert k.loc[k["kind"] == "elementwise", "name"].iloc[0] == ADD  # quoted name with commas
    nccl = k.loc[k["kind"] == "collective"].iloc[0]
    assert (nccl["collective"], nccl["protocol"]) == ("all_reduce", "LL")
    copy = k.loc[k["kind"] == "copy"].iloc[0]
    assert copy["name"] == "Memcpy HtoD (Pinned -> Device)"
    assert copy["copy_kind"] == "HtoD"
    assert copy["bytes"] == pytest.approx(1.049e6)
    assert pd.isna(copy["grid_x"])
    memset = k.loc[k["kind"] == "memset"].iloc[0]
    assert memset["name"] == "Memset (Device)"
    assert memset["bytes"] == pytest.approx(4000)
    assert b.syncs is None


def test_csv_time_unit_and_rank_from_name(tmp_path: Path) -> None:
    p = tmp_path / "run_rank2_gputrace.csv"
    p.write_text("Start (us),Duration (us),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),DymSMem (MB),"
                 "Bytes (MB),Throughput (MBps),SrcMemKd,DstMemKd,Device,Ctx,Strm,Name\n"
                 "2.5,1.25,9,1,1,1,32,1,1,16,0.000,0.000,,,,,NVIDIA H100 80GB HBM3 (1),1,7,my_kernel\n")
    b = load_nsys_csv(p)
    row = b.kernels.iloc[0]
    assert (row["start_s"], row["duration_s"], row["rank"], row["device"]) == (pytest.approx(2.5e-6),
                                                                               pytest.approx(1.25e-6), 2, 1)
    assert load_nsys_csv(p, rank=0).kernels["rank"].iloc[0] == 0


def test_csv_errors(tmp_path: Path) -> None:
    with pytest.raises(OvsimError) as e:
        load_nsys_csv(tmp_path / "nope.csv")
    assert e.value.field == "path"

    summary = tmp_path / "kern_sum.csv"
    summary.write_text("Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
                       "50.0,1000,2,500.0,500.0,400,600,141.4,my_kernel\n")
    with pytest.raises(OvsimError) as e:
        load_nsys_csv(summary)
    assert e.value.field == "header" and "cuda_gpu_trace" in e.value.message

    no_stream = tmp_path / "no_stream.csv"
    no_stream.write_text("Start (ns),Duration (ns),CorrId,Device,Name\n1,2,3,NVIDIA H100 80GB HBM3 (0),k\n")
    with pytest.raises(OvsimError) as e:
        load_nsys_csv(no_stream)
    assert e.value.field == "Strm"

    bad = tmp_path / "bad.csv"
    bad.write_text("Start (ns),Duration (ns),CorrId,Strm,Name\n1,2,3,7,k\n5,about ten,4,7,k\n")
    with pytest.raises(OvsimError) as e:
        load_nsys_csv(bad)
    assert (e.value.field, e.value.source) == ("Duration", str(bad))
    assert "line 3" in e.value.message

    unit = tmp_path / "unit.csv"
    unit.write_text("Start (fortnights),Duration (ns),CorrId,Strm,Name\n1,2,3,7,k\n")
    with pytest.raises(OvsimError, match="unknown time unit"):
        load_nsys_csv(unit)

    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(OvsimError, match="empty"):
        load_nsys_csv(empty)
