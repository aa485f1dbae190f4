"""The canonical kernel table: what every importer produces and replay consumes.

One row per GPU activity (kernel, copy, memset) of a measured run. Times are seconds on the trace's
own clock (importers keep each format's origin: Kineto's ``baseTimeNanoseconds``-relative
microseconds, nsys nanoseconds); rows of one bundle share that clock. Unknown integers are
``<NA>`` (pandas nullable ``Int64``), unknown floats NaN, unknown strings "".

Columns (name: dtype, meaning):

- ``rank``: Int64, global rank of the process that ran it (0 for a single-process trace)
- ``device``: Int64, CUDA device ordinal in that process
- ``stream``: Int64, CUDA stream id
- ``correlation``: Int64, CUPTI correlation id linking the activity to its host launch call
- ``name``: str, demangled kernel name, or ``Memcpy DtoD`` / ``Memset``
- ``kind``: one of :data:`KINDS`
- ``start_s``, ``duration_s``: float64, start time and duration (s)
- ``launch_s``: float64, start of the host launch call (s, NaN if the trace has none)
- ``grid_x``.. ``grid_z``, ``block_x``.. ``block_z``: Int64, launch configuration (at least 1; a
  recorded 0 or negative dimension is unknown)
- ``registers_per_thread``: Int64 (a negative count is unknown)
- ``shared_mem_bytes``: Int64, static plus dynamic shared memory per block (a negative size is unknown)
- ``bytes``: float64, bytes moved by a copy or memset (NaN for kernels)
- ``copy_kind``: str, ``HtoD``, ``DtoH``, ``DtoD``, ``PtoP``, ``HtoH`` for copies
- ``collective``: str, for NCCL kernels: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
  ``broadcast``, ``reduce``, ``send_recv``, ``send``, ``recv``
- ``algorithm``, ``protocol``: str, from the kernel name where it says so (``ring``/``tree``/``nvls``/..,
  ``LL``/``LL128``/``Simple``). NCCL runs other algorithms inside these kernels, so the name is a hint.
- ``dtype``: str, element type of a collective (``float32``, ``bfloat16``, ...)
- ``message_bytes``: float64, a collective's per-rank input size in bytes
- ``group_size``: Int64, ranks in the collective's process group
- ``process_group``: str, the process group's name
- ``seq``: Int64, the collective's sequence number in its process group, equal on every rank that runs it
- ``host_op``: str, the operator that launched it with its input shapes (``aten::mm[[64, 128], [128, 256]]``)
  where the trace records shapes; it tells problem sizes apart that share a kernel and launch shape
- ``host_types``: str, that operator's input types as the trace records them
  (``['c10::BFloat16', 'c10::BFloat16']``), "" where it does not
- ``host_op_id``: Int64, that operator call's id (Kineto's External id): the kernels one call launched
  share it
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ovsim.errors import OvsimError

KINDS = ("gemm", "attention", "elementwise", "norm", "collective", "copy", "memset", "other")

INT_COLUMNS = ("rank", "device", "stream", "correlation", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
               "block_z", "registers_per_thread", "shared_mem_bytes", "group_size", "seq", "host_op_id")
FLOAT_COLUMNS = ("start_s", "duration_s", "launch_s", "bytes", "message_bytes")
STR_COLUMNS = ("name", "kind", "copy_kind", "collective", "algorithm", "protocol", "dtype", "process_group",
               "host_op", "host_types")
COLUMNS = ("rank", "device", "stream", "correlation", "name", "kind", "start_s", "duration_s", "launch_s",
           "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread", "shared_mem_bytes",
           "bytes", "copy_kind", "collective", "algorithm", "protocol", "dtype", "message_bytes", "group_size",
           "process_group", "seq", "host_op", "host_types", "host_op_id")
REQUIRED = ("rank", "stream", "name", "start_s", "duration_s")
_LAUNCH_DIMS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")


@dataclass
class TraceBundle:
    """A measured run: the kernel table plus what the files said about the run."""

    kernels: pd.DataFrame
    # Per rank: the GPU's name as the trace reports it (deviceProperties, TARGET_INFO_GPU).
    gpu_names: dict[int, str] = field(default_factory=dict)
    world_size: int | None = None
    # Per rank: the file it came from.
    sources: dict[int, str] = field(default_factory=dict)
    # Rows an importer dropped, by reason (a count each; nothing is dropped silently).
    skipped: dict[str, int] = field(default_factory=dict)
    # Explicit cross-stream dependencies (event record -> stream wait), when the trace records them:
    # columns rank, waiting_stream, waiting_after_s (host time of the wait), recorded_correlation (the
    # correlation id of the activity the awaited event was recorded after) and, where known,
    # recorded_stream; importers that guess a wait from the calling thread add inferred=True.
    syncs: pd.DataFrame | None = None
    # Wall-clock time (seconds since 1970) of time 0 on the table's clock, where the trace says
    # (Kineto's baseTimeNanoseconds or epoch timestamps, Nsight Systems' session start); aligns
    # power logs with the trace.
    wall_origin_s: float | None = None
    # Software the run used, as the trace records it (e.g. cuda_driver_version, nccl_version);
    # a key whose ranks disagree lists their values joined by ", ".
    versions: dict[str, str] = field(default_factory=dict)


def merge_versions(per_part: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """Software versions of several parts of one run (files, ranks): a key whose parts disagree
    lists each value once, joined by ", "."""
    seen: dict[str, list[str]] = {}
    for versions in per_part:
        for k, v in versions.items():
            for part in v.split(", "):
                if part not in seen.setdefault(k, []):
                    seen[k].append(part)
    return {k: ", ".join(v) for k, v in sorted(seen.items())}


def make_table(columns: Mapping[str, Sequence[Any] | np.ndarray | pd.Series], source: str = "") -> pd.DataFrame:
    """Build a table from column arrays; missing optional columns are filled as unknown."""
    unknown = set(columns) - set(COLUMNS)
    if unknown:
        raise OvsimError(f"unknown kernel-table column(s) {sorted(unknown)}", source=source, field=sorted(unknown)[0])
    return validate_table(pd.DataFrame({c: list(v) if not isinstance(v, np.ndarray | pd.Series) else v
                                        for c, v in columns.items()}), source)


def validate_table(df: pd.DataFrame, source: str = "") -> pd.DataFrame:
    """Check a kernel table (e.g. one read back from parquet); returns it with canonical dtypes."""
    for c in REQUIRED:
        if c not in df.columns:
            raise OvsimError("missing column", source=source, field=c)
    n = len(df)
    out = pd.DataFrame(index=pd.RangeIndex(n))
    for c in COLUMNS:
        try:
            if c in INT_COLUMNS:
                out[c] = pd.array(df[c].to_numpy() if c in df.columns else [pd.NA] * n, dtype="Int64")
            elif c in FLOAT_COLUMNS:
                out[c] = df[c].to_numpy(dtype=np.float64) if c in df.columns else np.full(n, np.nan)
            else:
                col = df[c].astype(object).where(df[c].notna(), "") if c in df.columns else pd.Series([""] * n)
                out[c] = col.astype(str).to_numpy()
        except (TypeError, ValueError) as e:
            raise OvsimError(f"cannot read as {'integer' if c in INT_COLUMNS else 'number'}: {e}", source=source,
                             field=c) from None
    # A launch that could not have run is corrupt metadata, not a shape to replay: unknown, like a
    # value of the wrong type.
    for c, least in (*((c, 1) for c in _LAUNCH_DIMS), ("registers_per_thread", 0), ("shared_mem_bytes", 0)):
        out[c] = out[c].mask(out[c] < least)
    for c in ("rank", "stream"):
        if out[c].isna().any():
            raise OvsimError(f"{int(out[c].isna().sum())} row(s) without a value", source=source, field=c)
    for c in ("start_s", "duration_s"):
        bad = ~np.isfinite(out[c].to_numpy())
        if bad.any():
            raise OvsimError(f"{int(bad.sum())} row(s) with a non-finite value", source=source, field=c)
    if (out["duration_s"] < 0).any():
        raise OvsimError("negative duration", source=source, field="duration_s")
    unknown = set(out["kind"].unique()) - set(KINDS) - {""}
    if unknown:
        raise OvsimError(f"unknown kind(s) {sorted(unknown)}; expected one of {list(KINDS)}", source=source,
                         field="kind")
    kind = out["kind"].to_numpy(dtype=object)
    missing = kind == ""
    if missing.any():
        # Traces repeat a few hundred names many thousand times: classify each name once.
        names = out["name"].to_numpy(dtype=object)[missing]
        by_name = {n: classify(n) for n in set(names.tolist())}
        kind[missing] = [by_name[n] for n in names.tolist()]
        out["kind"] = kind
    return out


# -- kernel names --------------------------------------------------------------------------------

_NCCL = re.compile(r"^(?:void\s+)?(?:nccl|rccl)|ncclKernel|ncclDevKernel|ncclSymDevKernel")
# Collectives that are not NCCL's: PyTorch symmetric memory, vLLM/TensorRT-LLM custom all-reduce, DeepEP,
# and the calibration harness's communication-like kernels (NCCL's footprint, one block per channel).
_OTHER_COMM = re.compile(r"multimem_all_reduce|multimem_all_gather|one_shot_all_reduce|two_shot_all_reduce"
                         r"|cross_device_reduce|custom_?all_?reduce|dpsk::ep::|^ovsim_channel_")
_COPY = re.compile(r"^(?:hip)?memcpy|^dma", re.IGNORECASE)
_MEMSET = re.compile(r"^(?:hip)?memset", re.IGNORECASE)
_ATTN = re.compile(r"flash|fmha|attention|attn|sdpa|mha_|_mha|softmax_warp_forward.*attn|xformers|cudnn.*sdpa",
                   re.IGNORECASE)
_GEMM = re.compile(
    r"gemm|cutlass|cublas|sm\d\d_xmma|xmma_|matmul|_mm_|\bmm\b|ampere_.*(?:sgemm|hgemm|s1688|h1688|s16816|h16816)"
    r"|volta_.*gemm|turing_.*gemm|nvjet|cijk_|implicit_convolve|conv2d|convolution|dgrad|wgrad|fprop|winograd"
    r"|triton_.*mm|_tmm_|splitkreduce|gemv",
    re.IGNORECASE)
_NORM = re.compile(r"norm|softmax|layer_?norm|rms|batch_?norm|bn_(?:fw|bw)|reduce_kernel|reduction|welford",
                   re.IGNORECASE)


def classify(name: str) -> str:
    """The kernel kind from its name (first match wins: collective, copy, memset, attention, GEMM and
    convolution, norm/softmax/reduction, and elementwise for everything else that computes)."""
    if _NCCL.search(name) or _OTHER_COMM.search(name):
        return "collective"
    if _COPY.search(name):
        return "copy"
    if _MEMSET.search(name):
        return "memset"
    if _ATTN.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    if _NORM.search(name):
        return "norm"
    return "elementwise"


# A GEMM kernel's output tile in its name: cuBLAS's nvjet ("_320x128_64x3_"), CUTLASS
# ("_128x256_64x3_") and xmma ("tilesize128x256x32") spell it as tile M x N, then K and stages.
_TILE = re.compile(r"(?:tilesize|_)(\d{2,3})x(\d{2,3})(?:x\d{2,3}|_\d{2,3}x\d{1,2})(?:_|$)")


def gemm_tile(name: str) -> tuple[int, int] | None:
    """The output tile (rows, columns) a GEMM kernel's name gives, or None where it gives none."""
    m = _TILE.search(name)
    if m is None:
        return None
    a, b = int(m[1]), int(m[2])
    return (a, b) if 16 <= a <= 512 and 16 <= b <= 512 else None


# A Hopper GEMM kernel's cluster shape in its name, after the tile: cuBLAS's nvjet
# ("_256x128_64x4_1x2_h_") and CUTLASS 3 ("_128x256x64_2x1x1_").
_CLUSTER = re.compile(r"_\d{1,3}x\d{1,3}_\d{2,3}x\d{1,2}_(\d)x(\d)_[hv]_|_\d{2,3}x\d{2,3}x\d{2,3}_(\d)x(\d)x(\d)_")


def gemm_cluster(name: str) -> int:
    """The CTAs per thread-block cluster a GEMM kernel's name gives; 1 where it gives none."""
    m = _CLUSTER.search(name)
    if m is None:
        return 1
    return math.prod(int(d) for d in m.groups() if d is not None)


_COLL_NAMES = {
    "allreduce": "all_reduce", "allgather": "all_gather", "allgatherv": "all_gather",
    "reducescatter": "reduce_scatter", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv",
    "alltoall": "all_to_all", "send": "send", "recv": "recv", "_allgather_base": "all_gather",
    "_reduce_scatter_base": "reduce_scatter", "all_to_allv": "all_to_all", "all_to_all": "all_to_all",
    "all_gather": "all_gather", "all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter",
    "allgather_into_tensor_coalesced": "all_gather", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "gather": "gather", "scatter": "scatter", "barrier": "all_reduce",
}
_ALGOS = {"RING": "ring", "TREE": "tree", "NVLS": "nvls", "NVLS_TREE": "nvls_tree", "COLLNET_DIRECT": "collnet_direct",
          "COLLNET_CHAIN": "collnet_chain", "PAT": "pat"}
_PROTOS = {"LL": "LL", "LL128": "LL128", "SIMPLE": "Simple"}
_DTYPES = {
    "i8": "int8", "u8": "uint8", "i32": "int32", "u32": "uint32", "i64": "int64", "u64": "uint64",
    "f16": "float16", "f32": "float32", "f64": "float64", "bf16": "bfloat16", "f8e4m3": "float8_e4m3",
    "f8e5m2": "float8_e5m2", "int8_t": "int8", "uint8_t": "uint8", "int32_t": "int32", "uint32_t": "uint32",
    "int64_t": "int64", "uint64_t": "uint64", "half": "float16", "float": "float32", "double": "float64",
    "__nv_bfloat16": "bfloat16", "__nv_fp8_e4m3": "float8_e4m3", "__nv_fp8_e5m2": "float8_e5m2",
    # c10 ScalarType names, as record_param_comms writes them
    "Float": "float32", "Half": "float16", "BFloat16": "bfloat16", "Double": "float64", "Byte": "uint8",
    "Char": "int8", "Int": "int32", "Long": "int64", "Bool": "bool", "Float8_e4m3fn": "float8_e4m3",
    "Float8_e5m2": "float8_e5m2",
}
DTYPE_BYTES = {"int8": 1, "uint8": 1, "bool": 1, "float8_e4m3": 1, "float8_e5m2": 1, "float16": 2, "bfloat16": 2,
               "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8}


def normalize_collective(name: str) -> str:
    """A collective's canonical name from NCCL's or PyTorch's spelling ("" if unknown)."""
    key = name.strip()
    return _COLL_NAMES.get(key, _COLL_NAMES.get(key.lower().replace("_", ""), _COLL_NAMES.get(key.lower(), "")))


def normalize_dtype(name: str) -> str:
    return _DTYPES.get(name.strip(), "")


@dataclass(frozen=True)
class NcclName:
    collective: str = ""
    algorithm: str = ""
    protocol: str = ""
    dtype: str = ""


def parse_nccl_name(name: str) -> NcclName:
    """Collective, algorithm, protocol and dtype from an NCCL kernel name, in both schemes:
    ``ncclDevKernel_<Coll>[_<RedOp>_<type>]_<ALGO>_<PROTO>`` (NCCL >= 2.19) and
    ``ncclKernel_<Coll>_<ALGO>_<PROTO>_<RedOp>_<type>`` (older). Source: NVIDIA/nccl src/device/generate.py."""
    base = name.split("(", 1)[0].strip()
    if base.startswith("void "):
        base = base[5:]
    m = re.match(r"^(?:nccl|rccl)(?:Sym)?(?:Dev)?Kernel_(.*)$", base)
    if not m:
        return NcclName()
    parts = m.group(1).split("_")
    coll = normalize_collective(parts[0]) if parts else ""
    algo = proto = dtype = ""
    rest = parts[1:]
    # Algorithm names may contain an underscore (NVLS_TREE, COLLNET_DIRECT).
    i = 0
    while i < len(rest):
        two = "_".join(rest[i:i + 2])
        if two in _ALGOS or (two in _DTYPES and not dtype):
            if two in _ALGOS:
                algo = _ALGOS[two]
            else:
                dtype = _DTYPES[two]
            i += 2
            continue
        tok = rest[i]
        if tok in _ALGOS and not algo:
            algo = _ALGOS[tok]
        elif tok in _PROTOS and not proto:
            proto = _PROTOS[tok]
        elif tok in _DTYPES and not dtype:
            dtype = _DTYPES[tok]
        i += 1
    # Legacy names spell types in C: "unsigned char" cannot occur in a symbol, but "__nv_bfloat16"
    # splits on its underscores.
    if not dtype and "nv_bfloat16" in base:
        dtype = "bfloat16"
    return NcclName(coll, algo, proto, dtype)
