"""Builders of Kineto traces for the importer's tests (events, documents, files) and the path of
the shared public traces they read in place."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
from shared_traces import TRACES, real

__all__ = ["HTA", "TRACES", "doc", "kernel", "launch", "real", "write"]

HTA = "HolisticTraceAnalysis/tests/data"


GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4>(cutlass::Params)"
NCCL_AR = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def kernel(name: str = GEMM, ts: Any = 100.0, dur: float = 10.0, *, stream: int = 7, corr: int = 1,
           device: int = 0, cat: str = "kernel", **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"External id": corr, "device": device, "stream": stream, "correlation": corr,
                     "registers per thread": 32, "shared memory": 1024, "grid": [4, 2, 1], "block": [128, 1, 1],
                     **args}}


def launch(corr: int, ts: float, *, ext: int | None = None, name: str = "cudaLaunchKernel", tid: int = 11,
           cat: str = "cuda_runtime") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 10, "tid": tid, "ts": ts, "dur": 2.0,
            "args": {"External id": corr if ext is None else ext, "cbid": 211, "correlation": corr}}


def doc(events: list[Any], *, rank: int | None = 0, world: int | None = None, base: int | None = None,
        **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"schemaVersion": 1,
                         "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"},
                                              {"id": 1, "name": "NVIDIA A100-SXM4-80GB"}]}
    info: dict[str, Any] = {}
    if rank is not None:
        info["rank"] = rank
    if world is not None:
        info["world_size"] = world
    if info:
        d["distributedInfo"] = info
    d["traceEvents"] = events
    if base is not None:
        d["baseTimeNanoseconds"] = base
    d.update(extra)
    return d


def write(path: Path, content: dict[str, Any] | bytes, *, gz: bool = False) -> Path:
    data = content if isinstance(content, bytes) else orjson.dumps(content, option=orjson.OPT_INDENT_2)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path
