"""Nsight Systems importer: the SQLite export (``nsys export --type sqlite``), into the canonical
kernel table, and what it shares with the CSV report's reader (:mod:`ovsim.traces.nsys_csv`).

Schemas follow NVIDIA's Post-Collection Analysis Guide ("SQLite Schema Reference", schema 3.28.1 of nsys
2026.4, and the 2021.5 exporter reference for older files; "cuda_gpu_trace" for the CSV),
https://docs.nvidia.com/nsight-systems/AnalysisGuide/index.html.

SQLite export
-------------
Tables exist only when they have rows (the export is lazy) and columns come and go between versions,
so every table's columns are read from the file (``PRAGMA table_info``) and looked up by name.

- GPU activity comes from ``CUPTI_ACTIVITY_KIND_KERNEL`` (required), ``..._MEMCPY`` and ``..._MEMSET``.
  A kernel row needs ``start``, ``end``, ``deviceId``, ``streamId`` and one of ``demangledName``,
  ``shortName``, ``mangledName``; the name is the ``StringIds`` value of the first of those (in that
  order) that is set and not empty. ``correlationId``, ``globalPid``, the grid/block columns,
  ``registersPerThread`` and ``staticSharedMemory``/``dynamicSharedMemory`` (summed) are used when the
  file has them. Copies are named as Kineto names them, ``Memcpy HtoD (Pinned -> Device)``; their
  ``copy_kind`` comes from ``copyKind`` through the file's ``ENUM_CUDA_MEMCPY_OPER`` table when it
  has one, else from CUPTI's ``CUpti_ActivityMemcpyKind`` values (HtoD, DtoH, HtoA, AtoH, AtoA, AtoD,
  DtoA, DtoD, HtoH, PtoP; "" for unknown). Memsets are ``Memset (Device)`` (the memory kind in brackets).
- Times are nanoseconds on the session timeline, converted to seconds with the origin kept. Rows with
  ``end < start`` are dropped and counted in ``TraceBundle.skipped["negative duration"]``; rows without
  a start, end or stream are counted under ``"missing start, end or stream"``.
- ``launch_s`` is the start of the ``CUPTI_ACTIVITY_KIND_RUNTIME`` call of the same process with the
  same ``correlationId`` (kernels of a CUDA graph all get their ``cudaGraphLaunch``).
- A process is ``globalPid >> 24`` (``globalTid >> 24`` for host rows): the serialized GlobalId keeps
  the thread id in its low 24 bits and the PID, with the VM/host id above it, higher up. Activity
  without a ``globalPid`` belongs to the file's only process; with several it is dropped and counted
  (``"activity without a process (globalPid)"``). Without the column the file is one process.
- Ranks: nsys has no rank column. In this order, the first source that names every process with a
  distinct rank wins: the ``rank`` argument (single-process files only); the ``MPI_RANKS`` table
  (``globalTid``, ``rank``) that MPI tracing writes; an NVTX mark or range whose whole text is
  ``rank N`` (also ``rank=N``, ``rank:N``, ``rank_N``, ``rankN``; e.g. ``torch.cuda.nvtx.mark(f"rank
  {r}")``); for a single-process file, ``rank<N>`` in the file name (``nsys profile -o rank%q{RANK}``).
  (A single-process file also takes a lone MPI/NVTX rank that cannot be tied to its process, as when
  the activity tables lack ``globalPid``.) Otherwise processes are numbered 0, 1, ... in increasing
  PID order (launchers such as torchrun start ranks in order, so this usually, but not certainly,
  matches the real ranks). ``world_size`` is the number of processes when a multi-process file
  numbers them 0..n-1, else unknown.
- NCCL kernels get ``collective``/``algorithm``/``protocol``/``dtype`` from their name
  (:func:`parse_nccl_name`); message size, group and sequence number are not in the export.
- ``gpu_names``: ``TARGET_INFO_GPU.name`` of the device (``id``, else ``cuDevice``) a rank's activity
  ran on most.
- NVTX ranges are not imported into the table (only the rank marks above are read).
- ``wall_origin_s`` (the wall time of the session timeline's 0, which aligns power logs) is
  ``TARGET_INFO_SESSION_START_TIME.utcEpochNs``, where the export has it.

Explicit syncs (``TraceBundle.syncs``) are read by :mod:`ovsim.traces.nsys_sync`, which says how.

The ``nsys stats --report cuda_gpu_trace`` CSV reader is :mod:`ovsim.traces.nsys_csv`.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from ovsim.errors import OvsimError
from ovsim.traces.nsys_db import NS, PROC_SHIFT, NsysDb, count_skipped, quote
from ovsim.traces.nsys_sync import RECORD_CALL, WAIT_CALL, read_syncs
from ovsim.traces.table import TraceBundle, classify, parse_nccl_name, validate_table

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
STRINGS = "StringIds"

_SQLITE_MAGIC = b"SQLite format 3\x00"

# CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind values, for files without the ENUM_* tables.
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
               10: "PtoP"}
_MEM_KINDS = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed", 6: "Device Static",
              7: "Managed Static"}

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_.]?(\d+)(?!\d)", re.IGNORECASE)
_RANK_MARK = re.compile(r"\s*rank\s*[=:_#-]?\s*(\d+)\s*", re.IGNORECASE)

# -- shared ---------------------------------------------------------------------------------------

def _existing_file(path: str | Path) -> tuple[Path, str]:
    p, src = Path(path), str(path)
    if not p.exists():
        raise OvsimError("no such file", source=src, field="path")
    if not p.is_file():
        raise OvsimError("not a file", source=src, field="path")
    return p, src


def rank_from_name(path: str | Path) -> int | None:
    """The rank a file name states (``rank3.sqlite``, ``trace_rank_3.csv``), or None."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def _copy_kind_from_text(text: str) -> str:
    """``HtoD`` from ``HTOD``, ``HtoD``, ``CUDA_MEMCPY_KIND_HTOD`` or ``Host-to-Device``; "" if none."""
    t = text.strip()
    m = re.search(r"(host|device|array|peer)\s*-\s*to\s*-\s*(host|device|array|peer)", t, re.IGNORECASE)
    if m:
        return f"{m.group(1)[0].upper()}to{m.group(2)[0].upper()}"
    m = re.search(r"(?:^|[_\s\[])([HDAP])TO([HDAP])$", t.upper())
    if m:
        return f"{m.group(1)}to{m.group(2)}"
    return ""


def _copy_name(kind: str, src: str, dst: str) -> str:
    text = f"Memcpy {kind or 'Unknown'}"
    return f"{text} ({src} -> {dst})" if src or dst else text


def _finish(act: pd.DataFrame, src: str) -> pd.DataFrame:
    """The canonical table from importer columns (NCCL fields added, rows in time order)."""
    names = act["name"].astype(str).tolist()
    # Per distinct name: a long run repeats a few hundred names millions of times.
    parsed = {n: parse_nccl_name(n) for n in set(names)}
    kinds = {n: classify(n) for n in parsed}
    act = act.assign(kind=[k or kinds[n] for k, n in zip(act["kind"].astype(str).tolist(), names, strict=True)],
                     collective=[parsed[n].collective for n in names], algorithm=[parsed[n].algorithm for n in names],
                     protocol=[parsed[n].protocol for n in names], dtype=[parsed[n].dtype for n in names])
    act = act.sort_values(["rank", "start_s", "stream"], kind="stable").reset_index(drop=True)
    return validate_table(act, src)


def _most_common(values: Iterable[int]) -> int | None:
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return max(counts, key=lambda k: (counts[k], -k)) if counts else None


def load_nsys_sqlite(path: str | Path, *, rank: int | None = None) -> TraceBundle:
    """Read an Nsight Systems SQLite export (see the module docstring for what is read and how)."""
    p, src = _existing_file(path)
    try:
        with p.open("rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except OSError as e:
        raise OvsimError(f"cannot read: {e.strerror}", source=src, field="path") from None
    if head != _SQLITE_MAGIC:
        hint = ("; this is an .nsys-rep report: export it with `nsys export --type sqlite`"
                if p.suffix in (".nsys-rep", ".qdrep") else "")
        raise OvsimError(f"not a SQLite database{hint}", source=src, field="file")
    try:
        con = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise OvsimError(f"cannot open as SQLite: {e}", source=src, field="file") from None
    # Names are user text (NVTX, kernel names); a bad byte should not stop the import.
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")
    try:
        return _read_sqlite(NsysDb(con, src), p, rank)
    except (sqlite3.Error, pd.errors.DatabaseError) as e:
        # pandas wraps the sqlite3 error (with the whole query) in its own DatabaseError.
        raise OvsimError(f"not a readable SQLite database: {e.__cause__ or e}", source=src, field="file") from None
    except UnicodeDecodeError:
        # sqlite3 decodes its own error messages, which quote the damaged schema bytes.
        raise OvsimError("not a readable SQLite database: damaged schema", source=src, field="file") from None
    finally:
        con.close()


_GRID = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")
_GRID_OUT = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
_COMMON = ("correlationId", "globalPid")


def _read_sqlite(db: NsysDb, p: Path, rank: int | None) -> TraceBundle:
    src = db.src
    if not db.has(KERNEL):
        raise OvsimError("no kernel table: the export has no CUDA kernels (profile with --trace=cuda)",
                         source=src, field=KERNEL)
    name_cols = [c for c in ("demangledName", "shortName", "mangledName") if db.has_columns(KERNEL, (c,))]
    if not name_cols:
        raise OvsimError("required column missing (no demangledName, shortName or mangledName)", source=src,
                         field=f"{KERNEL}.demangledName")
    strings = _strings(db)
    skipped: dict[str, int] = {}
    parts = [_kernels(db, name_cols, strings)]
    if db.has(MEMCPY):
        parts.append(_memcpys(db))
    if db.has(MEMSET):
        parts.append(_memsets(db))
    act = pd.concat([x for x in parts if len(x)] or parts[:1], ignore_index=True)
    act = _drop_bad_times(act, skipped)
    runtime = _runtime(db, strings)
    act_procs = sorted({int(x) for x in act["proc"].dropna().tolist()})
    if not act_procs:  # no globalPid: one process, whatever the host rows say
        act["proc"] = pd.array([0] * len(act), dtype="Int64")
        runtime["proc"] = pd.array([0] * len(runtime), dtype="Int64")
    else:
        act = _fill_process(act, act_procs, skipped, "activity without a process (globalPid)")
        runtime = _fill_process(runtime, act_procs, {}, "")
    act = _attach_launch(act, runtime)
    procs = sorted({int(x) for x in act["proc"].tolist()})
    rank_of = _ranks(db, p, procs, rank, strings)
    act["rank"] = act["proc"].map(lambda x: rank_of[int(x)])
    act["start_s"] = act["start_ns"].to_numpy(dtype=float) * NS
    act["duration_s"] = (act["end_ns"] - act["start_ns"]).to_numpy(dtype=float) * NS
    act["launch_s"] = act["launch_ns"].to_numpy(dtype=float, na_value=np.nan) * NS
    table = _finish(act.drop(columns=["proc", "start_ns", "end_ns", "launch_ns", "tid"]), src)

    syncs = read_syncs(db, act, runtime, rank_of, skipped)
    ranks = sorted(set(rank_of.values()))
    world = len(procs) if len(procs) > 1 and ranks == list(range(len(procs))) else None
    return TraceBundle(kernels=table, gpu_names=_gpu_names(db, table), world_size=world,
                       sources={r: src for r in ranks}, skipped=skipped, syncs=syncs, wall_origin_s=_wall_origin(db))


def _wall_origin(db: NsysDb) -> float | None:
    """Wall time (s since 1970, UTC) of the session timeline's 0, which the table's times keep:
    ``TARGET_INFO_SESSION_START_TIME.utcEpochNs``; None where the export has no single such row."""
    table = "TARGET_INFO_SESSION_START_TIME"
    if not db.has_columns(table, ("utcEpochNs",)):
        return None
    values = db.ints(db.read(table, ("utcEpochNs",)), table, "utcEpochNs").dropna().tolist()
    if len(set(values)) != 1 or int(str(values[0])) <= 0:
        return None
    return int(str(values[0])) * NS


def _strings(db: NsysDb) -> dict[int, str]:
    if not db.has(STRINGS):
        return {}
    cols = db.columns(STRINGS)
    if "id" not in cols or "value" not in cols:
        missing = "id" if "id" not in cols else "value"
        raise OvsimError("required column missing", source=db.src, field=f"{STRINGS}.{missing}")
    sql = f"SELECT {quote(cols['id'])}, {quote(cols['value'])} FROM {STRINGS}"
    return {int(i): str(v) for i, v in db.con.execute(sql)
            if isinstance(i, int) and v is not None}


def _resolve(db: NsysDb, df: pd.DataFrame, col: str, strings: dict[int, str]) -> list[str]:
    """Names from a StringIds column; a value that is text already is kept as it is."""
    out: list[str] = []
    missing = False
    for v in df[col].tolist():
        if v is None or v is pd.NA:
            out.append("")
            continue
        try:
            key = int(v)
        except (TypeError, ValueError):
            out.append(str(v))
            continue
        if key in strings:
            out.append(strings[key])
        else:
            missing = True
            out.append("")
    if missing and not strings:
        raise OvsimError("names are StringIds ids but the file has no StringIds table", source=db.src, field=STRINGS)
    return out


def _base(db: NsysDb, df: pd.DataFrame, table: str) -> pd.DataFrame:
    """Columns every activity table shares, under importer names."""
    pid = db.ints(df, table, "globalPid")
    return pd.DataFrame({
        "proc": (pid // PROC_SHIFT).astype("Int64"),
        "device": db.ints(df, table, "deviceId"),
        "stream": db.ints(df, table, "streamId"),
        "correlation": db.ints(df, table, "correlationId"),
        "start_ns": db.ints(df, table, "start"),
        "end_ns": db.ints(df, table, "end"),
    }, index=df.index)


def _kernels(db: NsysDb, name_cols: list[str], strings: dict[int, str]) -> pd.DataFrame:
    df = db.read(KERNEL, ("start", "end", "deviceId", "streamId"),
                 (*_COMMON, *name_cols, *_GRID, "registersPerThread", "staticSharedMemory", "dynamicSharedMemory"))
    out = _base(db, df, KERNEL)
    names = [""] * len(df)
    for col in name_cols:
        resolved = _resolve(db, df, col, strings)
        names = [n or r for n, r in zip(names, resolved, strict=True)]
    out["name"] = [n or "<unnamed kernel>" for n in names]
    out["kind"] = ""
    for c, o in zip(_GRID, _GRID_OUT, strict=True):
        out[o] = db.ints(df, KERNEL, c)
    out["registers_per_thread"] = db.ints(df, KERNEL, "registersPerThread")
    # NA only where neither part is known.
    out["shared_mem_bytes"] = db.ints(df, KERNEL, "staticSharedMemory").add(
        db.ints(df, KERNEL, "dynamicSharedMemory"), fill_value=0)
    return out


def _memcpys(db: NsysDb) -> pd.DataFrame:
    df = db.read(MEMCPY, ("start", "end", "streamId"),
                 (*_COMMON, "deviceId", "bytes", "copyKind", "srcKind", "dstKind"))
    out = _base(db, df, MEMCPY)
    kinds = db.enum("ENUM_CUDA_MEMCPY_OPER")
    mems = _MEM_KINDS
    copy = db.ints(df, MEMCPY, "copyKind").tolist()
    srcs = db.ints(df, MEMCPY, "srcKind").tolist()
    dsts = db.ints(df, MEMCPY, "dstKind").tolist()

    def kind_of(k: object) -> str:
        if k is pd.NA:
            return ""
        key = int(str(k))
        return (_copy_kind_from_text(kinds[key]) if key in kinds else "") or _COPY_KINDS.get(key, "")

    def mem(k: object) -> str:
        return "" if k is pd.NA else mems.get(int(str(k)), "Unknown")

    ck = [kind_of(k) for k in copy]
    out["copy_kind"] = ck
    out["name"] = [_copy_name(k, mem(s), mem(d)) for k, s, d in zip(ck, srcs, dsts, strict=True)]
    out["kind"] = "copy"
    out["bytes"] = db.ints(df, MEMCPY, "bytes").to_numpy(dtype=float, na_value=np.nan)
    return out


def _memsets(db: NsysDb) -> pd.DataFrame:
    df = db.read(MEMSET, ("start", "end", "streamId"), (*_COMMON, "deviceId", "bytes", "memKind"))
    out = _base(db, df, MEMSET)
    out["name"] = [f"Memset ({_MEM_KINDS.get(int(str(k)), 'Unknown')})" if k is not pd.NA else "Memset"
                   for k in db.ints(df, MEMSET, "memKind").tolist()]
    out["kind"] = "memset"
    out["bytes"] = db.ints(df, MEMSET, "bytes").to_numpy(dtype=float, na_value=np.nan)
    return out


def _fill_process(df: pd.DataFrame, procs: list[int], skipped: dict[str, int], reason: str) -> pd.DataFrame:
    """Rows without a process belong to the file's only process; with several they cannot be placed
    and are dropped (counted under ``reason``)."""
    missing = df["proc"].isna().to_numpy(dtype=bool)
    if not missing.any():
        return df
    if len(procs) == 1:
        return df.assign(proc=df["proc"].fillna(procs[0]))
    count_skipped(skipped, reason, int(missing.sum()))
    return df.loc[~missing].reset_index(drop=True)


def _drop_bad_times(act: pd.DataFrame, skipped: dict[str, int]) -> pd.DataFrame:
    missing = (act["start_ns"].isna() | act["end_ns"].isna() | act["stream"].isna()).to_numpy(dtype=bool)
    if missing.any():
        skipped["missing start, end or stream"] = skipped.get("missing start, end or stream", 0) + int(missing.sum())
    act = act.loc[~missing].reset_index(drop=True)
    negative = (act["end_ns"] < act["start_ns"]).to_numpy(dtype=bool)
    if negative.any():
        skipped["negative duration"] = skipped.get("negative duration", 0) + int(negative.sum())
    return act.loc[~negative].reset_index(drop=True)


def _runtime(db: NsysDb, strings: dict[int, str]) -> pd.DataFrame:
    """Host CUDA calls that launched an activity or record/wait an event: proc, tid, start_ns,
    correlation and what the call is ("launch", "record", "wait")."""
    empty = pd.DataFrame({"proc": pd.array([], dtype="Int64"), "tid": pd.array([], dtype="Int64"),
                          "start_ns": pd.array([], dtype="Int64"), "correlation": pd.array([], dtype="Int64"),
                          "call": pd.Series([], dtype=object)})
    if not db.has_columns(RUNTIME, ("start", "correlationId")):
        return empty
    cols = db.columns(RUNTIME)
    sync_ids = [i for i, v in strings.items() if RECORD_CALL.match(v) or WAIT_CALL.match(v)]
    corr = quote(cols["correlationid"])
    sources = [f"SELECT {quote(db.columns(t)['correlationid'])} FROM {quote(t)}" for t in (KERNEL, MEMCPY, MEMSET)
               if db.has_columns(t, ("correlationId",))]
    # Only the calls that matter are read: a long run has millions of other runtime calls.
    conds = [f"{corr} IN ({' UNION '.join(sources)})"] if sources else []
    if sync_ids and "nameid" in cols:
        conds.append(f"{quote(cols['nameid'])} IN ({', '.join(str(i) for i in sync_ids)})")
    if not conds:
        return empty
    df = db.read(RUNTIME, ("start", "correlationId"), ("globalTid", "nameId"), where=" WHERE " + " OR ".join(conds))
    tid = db.ints(df, RUNTIME, "globalTid")
    call_of = {i: "record" if RECORD_CALL.match(strings[i]) else "wait" for i in sync_ids}
    calls = [call_of.get(n, "launch") for n in db.ints(df, RUNTIME, "nameId").tolist()]
    return pd.DataFrame({"proc": (tid // PROC_SHIFT).astype("Int64"), "tid": tid,
                         "start_ns": db.ints(df, RUNTIME, "start"),
                         "correlation": db.ints(df, RUNTIME, "correlationId"), "call": calls})


def _attach_launch(act: pd.DataFrame, runtime: pd.DataFrame) -> pd.DataFrame:
    launches = runtime.loc[(runtime["call"] == "launch") & runtime["correlation"].notna()]
    launches = launches.drop_duplicates(["proc", "correlation"])[["proc", "correlation", "start_ns", "tid"]]
    merged = act.merge(launches.rename(columns={"start_ns": "launch_ns"}), on=["proc", "correlation"], how="left")
    return merged


def _ranks(db: NsysDb, p: Path, procs: list[int], rank: int | None, strings: dict[int, str]) -> dict[int, int]:
    if not procs:
        return {}
    if rank is not None:
        if len(procs) > 1:
            raise OvsimError(f"the file holds {len(procs)} processes; a rank can be given only for one", source=db.src,
                             field="rank")
        return {procs[0]: int(rank)}
    for found in (_mpi_ranks(db), _nvtx_ranks(db, strings)):
        named = {pr: found[pr] for pr in procs if pr in found}
        if len(named) == len(procs) and len(set(named.values())) == len(procs):
            return named
        # One process and one rank named anywhere: the activity may carry no globalPid to key it by.
        if len(procs) == 1 and len(set(found.values())) == 1:
            return {procs[0]: next(iter(found.values()))}
    if len(procs) == 1:
        by_name = rank_from_name(p)
        return {procs[0]: by_name if by_name is not None else 0}
    pid_order = sorted(procs, key=lambda k: (k % PROC_SHIFT, k))
    return {pr: i for i, pr in enumerate(pid_order)}


def _unique_per_proc(pairs: Iterable[tuple[int, int]]) -> dict[int, int]:
    seen: dict[int, set[int]] = {}
    for proc, r in pairs:
        seen.setdefault(proc, set()).add(r)
    return {proc: next(iter(rs)) for proc, rs in seen.items() if len(rs) == 1}


def _mpi_ranks(db: NsysDb) -> dict[int, int]:
    if not db.has_columns("MPI_RANKS", ("globalTid", "rank")):
        return {}
    df = db.read("MPI_RANKS", ("globalTid", "rank"))
    tid, r = db.ints(df, "MPI_RANKS", "globalTid"), db.ints(df, "MPI_RANKS", "rank")
    return _unique_per_proc((int(t) // PROC_SHIFT, int(x)) for t, x in zip(tid.tolist(), r.tolist(), strict=True)
                            if t is not pd.NA and x is not pd.NA)


def _nvtx_ranks(db: NsysDb, strings: dict[int, str]) -> dict[int, int]:
    if not db.has_columns("NVTX_EVENTS", ("globalTid",)):
        return {}
    df = db.read("NVTX_EVENTS", ("globalTid",), ("text", "textId"))
    tids = db.ints(df, "NVTX_EVENTS", "globalTid").tolist()
    texts = df["text"].tolist() if "text" in df.columns else [None] * len(df)
    ids = db.ints(df, "NVTX_EVENTS", "textId").tolist()
    pairs = []
    for text, text_id, gtid in zip(texts, ids, tids, strict=True):
        # Unregistered strings are in `text`, registered ones in StringIds through `textId`.
        if text is not None and text is not pd.NA:
            label = str(text)
        else:
            label = strings.get(int(str(text_id)), "") if text_id is not pd.NA else ""
        m = _RANK_MARK.fullmatch(label) if label else None
        if m and gtid is not pd.NA:
            pairs.append((int(str(gtid)) // PROC_SHIFT, int(m.group(1))))
    return _unique_per_proc(pairs)


def _gpu_names(db: NsysDb, table: pd.DataFrame) -> dict[int, str]:
    if not db.has_columns("TARGET_INFO_GPU", ("name",)):
        return {}
    df = db.read("TARGET_INFO_GPU", ("name",), ("id", "cuDevice"))
    names = [str(n) for n in df["name"].tolist()]
    by_id: dict[int, str] = {}
    for col in ("cuDevice", "id"):  # id wins: the activity tables' deviceId is TARGET_INFO_GPU.id
        for k, n in zip(db.ints(df, "TARGET_INFO_GPU", col).tolist(), names, strict=True):
            if k is not pd.NA and n:
                by_id[int(str(k))] = n
    distinct = {n for n in names if n}
    out: dict[int, str] = {}
    for r, dev in table.groupby("rank")["device"]:
        d = _most_common(int(x) for x in dev.dropna().tolist())
        if d is not None and d in by_id:
            out[int(str(r))] = by_id[d]
        elif len(distinct) == 1:
            out[int(str(r))] = next(iter(distinct))
    return out


# -- cuda_gpu_trace CSV ---------------------------------------------------------------------------


def __getattr__(name: str) -> object:
    """``load_nsys_csv`` moved to :mod:`ovsim.traces.nsys_csv`; it is still found here."""
    if name == "load_nsys_csv":
        from ovsim.traces.nsys_csv import load_nsys_csv

        return load_nsys_csv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
