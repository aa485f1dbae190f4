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

Explicit syncs (``TraceBundle.syncs``: ``rank``, ``waiting_stream``, ``waiting_after_s``,
``recorded_correlation``, plus ``inferred``) are derived one of two ways:

1. From CUPTI's own records, when the file has ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` and
   ``CUPTI_ACTIVITY_KIND_CUDA_EVENT`` (CUpti_ActivitySynchronization / CUpti_ActivityCudaEvent: both
   carry ``streamId``, ``eventId``, ``correlationId``). Each sync row of type STREAM_WAIT_EVENT
   (``syncType`` through ``ENUM_CUPTI_SYNC_TYPE``, else CUPTI's value 2) is a wait: ``waiting_stream``
   is its ``streamId`` and ``waiting_after_s`` the host start of its ``cudaStreamWaitEvent`` (the
   runtime row with its correlation id, else the sync row's ``start``). The event record it waits
   on is the latest CUDA_EVENT row of the same process and ``eventId`` with a smaller correlation id
   (correlation ids grow in API-call order within a process), and ``recorded_correlation`` is the
   correlation id of the GPU activity last launched on that record's stream before it (largest smaller
   correlation id). ``inferred`` is False.
2. Otherwise from the runtime calls alone. ``CUPTI_ACTIVITY_KIND_RUNTIME`` has no stream or event
   handle column (only start, end, eventClass, globalTid, correlationId, nameId, returnValue,
   callchainId), so the streams are inferred from the launch order of the calling host thread: for
   each ``cudaStreamWaitEvent*``/``cuStreamWaitEvent*`` call (``nameId`` -> ``StringIds``), the event
   is taken as the latest ``cudaEventRecord*``/``cuEventRecord*`` of the same thread before it,
   ``recorded_correlation`` is the activity that thread launched last before that record call,
   ``waiting_stream`` the stream of the first activity that thread launched after the wait, and
   ``waiting_after_s`` the wait's host start. This is right for the usual pattern (record after the
   producer's launches, wait just before the consumer's) and wrong when a thread records on a stream
   it did not launch on last; such rows have ``inferred`` True. Rows whose two streams come out
   equal are dropped (counted as ``"sync: inferred streams equal"``).

Waits whose record, recorded activity or waiting stream cannot be found are dropped and counted under
``"sync: ..."`` keys of ``skipped``.

The ``nsys stats --report cuda_gpu_trace`` CSV reader is :mod:`ovsim.traces.nsys_csv`.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ovsim.errors import OvsimError
from ovsim.traces.table import TraceBundle, classify, parse_nccl_name, validate_table

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNCHRONIZATION = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
CUDA_EVENT = "CUPTI_ACTIVITY_KIND_CUDA_EVENT"
STRINGS = "StringIds"

_SQLITE_MAGIC = b"SQLite format 3\x00"
_NS = 1e-9
# Serialized GlobalId: the low 24 bits are the thread id, the PID (and VM/host id) sit above them.
_PROC_SHIFT = 1 << 24

# CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind values, for files without the ENUM_* tables.
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
               10: "PtoP"}
_MEM_KINDS = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed", 6: "Device Static",
              7: "Managed Static"}
_STREAM_WAIT_EVENT = 2  # CUpti_ActivitySynchronizationType

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_.]?(\d+)(?!\d)", re.IGNORECASE)
_RANK_MARK = re.compile(r"\s*rank\s*[=:_#-]?\s*(\d+)\s*", re.IGNORECASE)
_RECORD_CALL = re.compile(r"^(?:cuda|cu)EventRecord")
_WAIT_CALL = re.compile(r"^(?:cuda|cu)StreamWaitEvent")

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


# -- SQLite ---------------------------------------------------------------------------------------

def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _to_int(values: pd.Series, src: str, field: str) -> pd.Series:
    """Int64 from a column that should hold integers; anything else is an error naming the field."""
    if str(values.dtype) == "Int64":
        return values
    num = pd.to_numeric(values, errors="coerce")
    bad = num.isna() & values.notna()
    arr = num.to_numpy(dtype=float, na_value=np.nan)
    frac = np.isfinite(arr) & (np.round(arr) != arr)
    if bad.any() or frac.any():
        first = str(values[bad | frac].iloc[0])
        raise OvsimError(f"{int(bad.sum() + frac.sum())} value(s) are not integers (first: {first!r})", source=src,
                         field=field)
    return pd.Series(pd.array(np.round(arr), dtype="Int64") if len(arr) else pd.array([], dtype="Int64"),
                     index=values.index)


class _Db:
    def __init__(self, con: sqlite3.Connection, src: str) -> None:
        self.con = con
        self.src = src
        rows = con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        self.tables = {str(r[0]) for r in rows}
        self._cols: dict[str, dict[str, str]] = {}
        self.version = ""
        if "META_DATA_EXPORT" in self.tables and {"name", "value"} <= set(self.columns("META_DATA_EXPORT")):
            row = con.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_SCHEMA_VERSION'").fetchone()
            self.version = str(row[0]) if row else ""

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> dict[str, str]:
        """Lower-case name -> the file's spelling (SQLite compares column names without case)."""
        if table not in self._cols:
            info = self.con.execute(f"PRAGMA table_info({_q(table)})").fetchall()
            self._cols[table] = {str(r[1]).lower(): str(r[1]) for r in info}
        return self._cols[table]

    def has_columns(self, table: str, names: Sequence[str]) -> bool:
        cols = self.columns(table) if self.has(table) else {}
        return all(n.lower() in cols for n in names)

    def read(self, table: str, required: Sequence[str], optional: Sequence[str] = (), where: str = "") -> pd.DataFrame:
        """The named columns (under the names asked for); optional ones the file lacks are left out."""
        cols = self.columns(table)
        for c in required:
            if c.lower() not in cols:
                version = f" (export schema {self.version})" if self.version else ""
                raise OvsimError(f"required column missing{version}", source=self.src, field=f"{table}.{c}")
        use = [c for c in (*required, *optional) if c.lower() in cols]
        sql = f"SELECT {', '.join(f'{_q(cols[c.lower()])} AS {_q(c)}' for c in use)} FROM {_q(table)}{where}"
        return pd.read_sql_query(sql, self.con, dtype_backend="numpy_nullable")

    def ints(self, df: pd.DataFrame, table: str, col: str) -> pd.Series:
        if col not in df.columns:
            return pd.Series(pd.array([pd.NA] * len(df), dtype="Int64"), index=df.index)
        return _to_int(df[col], self.src, f"{table}.{col}")

    def enum(self, table: str) -> dict[int, str]:
        """An ``ENUM_*`` table (id, name, label) as id -> "name | label" ({} if the file has none)."""
        out: dict[int, str] = {}
        if not self.has_columns(table, ("id",)):
            return out
        cols = self.columns(table)
        text_cols = [cols[c] for c in ("name", "label") if c in cols]
        if not text_cols:
            return out
        for row in self.con.execute(f"SELECT {_q(cols['id'])}, {', '.join(_q(c) for c in text_cols)} FROM {_q(table)}"):
            if isinstance(row[0], int):
                texts = [str(t) for t in row[1:] if t is not None]
                if texts:
                    out[row[0]] = " | ".join(texts)
        return out


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
        return _read_sqlite(_Db(con, src), p, rank)
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


def _read_sqlite(db: _Db, p: Path, rank: int | None) -> TraceBundle:
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
    act["start_s"] = act["start_ns"].to_numpy(dtype=float) * _NS
    act["duration_s"] = (act["end_ns"] - act["start_ns"]).to_numpy(dtype=float) * _NS
    act["launch_s"] = act["launch_ns"].to_numpy(dtype=float, na_value=np.nan) * _NS
    table = _finish(act.drop(columns=["proc", "start_ns", "end_ns", "launch_ns", "tid"]), src)

    syncs = _syncs(db, act, runtime, rank_of, skipped)
    ranks = sorted(set(rank_of.values()))
    world = len(procs) if len(procs) > 1 and ranks == list(range(len(procs))) else None
    return TraceBundle(kernels=table, gpu_names=_gpu_names(db, table), world_size=world,
                       sources={r: src for r in ranks}, skipped=skipped, syncs=syncs, wall_origin_s=_wall_origin(db))


def _wall_origin(db: _Db) -> float | None:
    """Wall time (s since 1970, UTC) of the session timeline's 0, which the table's times keep:
    ``TARGET_INFO_SESSION_START_TIME.utcEpochNs``; None where the export has no single such row."""
    table = "TARGET_INFO_SESSION_START_TIME"
    if not db.has_columns(table, ("utcEpochNs",)):
        return None
    values = db.ints(db.read(table, ("utcEpochNs",)), table, "utcEpochNs").dropna().tolist()
    if len(set(values)) != 1 or int(str(values[0])) <= 0:
        return None
    return int(str(values[0])) * _NS


def _strings(db: _Db) -> dict[int, str]:
    if not db.has(STRINGS):
        return {}
    cols = db.columns(STRINGS)
    if "id" not in cols or "value" not in cols:
        missing = "id" if "id" not in cols else "value"
        raise OvsimError("required column missing", source=db.src, field=f"{STRINGS}.{missing}")
    return {int(i): str(v) for i, v in db.con.execute(f"SELECT {_q(cols['id'])}, {_q(cols['value'])} FROM {STRINGS}")
            if isinstance(i, int) and v is not None}


def _resolve(db: _Db, df: pd.DataFrame, col: str, strings: dict[int, str]) -> list[str]:
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


def _base(db: _Db, df: pd.DataFrame, table: str) -> pd.DataFrame:
    """Columns every activity table shares, under importer names."""
    pid = db.ints(df, table, "globalPid")
    return pd.DataFrame({
        "proc": (pid // _PROC_SHIFT).astype("Int64"),
        "device": db.ints(df, table, "deviceId"),
        "stream": db.ints(df, table, "streamId"),
        "correlation": db.ints(df, table, "correlationId"),
        "start_ns": db.ints(df, table, "start"),
        "end_ns": db.ints(df, table, "end"),
    }, index=df.index)


def _kernels(db: _Db, name_cols: list[str], strings: dict[int, str]) -> pd.DataFrame:
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


def _memcpys(db: _Db) -> pd.DataFrame:
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


def _memsets(db: _Db) -> pd.DataFrame:
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
    _count(skipped, reason, int(missing.sum()))
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


def _runtime(db: _Db, strings: dict[int, str]) -> pd.DataFrame:
    """Host CUDA calls that launched an activity or record/wait an event: proc, tid, start_ns,
    correlation and what the call is ("launch", "record", "wait")."""
    empty = pd.DataFrame({"proc": pd.array([], dtype="Int64"), "tid": pd.array([], dtype="Int64"),
                          "start_ns": pd.array([], dtype="Int64"), "correlation": pd.array([], dtype="Int64"),
                          "call": pd.Series([], dtype=object)})
    if not db.has_columns(RUNTIME, ("start", "correlationId")):
        return empty
    cols = db.columns(RUNTIME)
    sync_ids = [i for i, v in strings.items() if _RECORD_CALL.match(v) or _WAIT_CALL.match(v)]
    corr = _q(cols["correlationid"])
    sources = [f"SELECT {_q(db.columns(t)['correlationid'])} FROM {_q(t)}" for t in (KERNEL, MEMCPY, MEMSET)
               if db.has_columns(t, ("correlationId",))]
    # Only the calls that matter are read: a long run has millions of other runtime calls.
    conds = [f"{corr} IN ({' UNION '.join(sources)})"] if sources else []
    if sync_ids and "nameid" in cols:
        conds.append(f"{_q(cols['nameid'])} IN ({', '.join(str(i) for i in sync_ids)})")
    if not conds:
        return empty
    df = db.read(RUNTIME, ("start", "correlationId"), ("globalTid", "nameId"), where=" WHERE " + " OR ".join(conds))
    tid = db.ints(df, RUNTIME, "globalTid")
    call_of = {i: "record" if _RECORD_CALL.match(strings[i]) else "wait" for i in sync_ids}
    calls = [call_of.get(n, "launch") for n in db.ints(df, RUNTIME, "nameId").tolist()]
    return pd.DataFrame({"proc": (tid // _PROC_SHIFT).astype("Int64"), "tid": tid,
                         "start_ns": db.ints(df, RUNTIME, "start"),
                         "correlation": db.ints(df, RUNTIME, "correlationId"), "call": calls})


def _attach_launch(act: pd.DataFrame, runtime: pd.DataFrame) -> pd.DataFrame:
    launches = runtime.loc[(runtime["call"] == "launch") & runtime["correlation"].notna()]
    launches = launches.drop_duplicates(["proc", "correlation"])[["proc", "correlation", "start_ns", "tid"]]
    merged = act.merge(launches.rename(columns={"start_ns": "launch_ns"}), on=["proc", "correlation"], how="left")
    return merged


def _ranks(db: _Db, p: Path, procs: list[int], rank: int | None, strings: dict[int, str]) -> dict[int, int]:
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
    pid_order = sorted(procs, key=lambda k: (k % _PROC_SHIFT, k))
    return {pr: i for i, pr in enumerate(pid_order)}


def _unique_per_proc(pairs: Iterable[tuple[int, int]]) -> dict[int, int]:
    seen: dict[int, set[int]] = {}
    for proc, r in pairs:
        seen.setdefault(proc, set()).add(r)
    return {proc: next(iter(rs)) for proc, rs in seen.items() if len(rs) == 1}


def _mpi_ranks(db: _Db) -> dict[int, int]:
    if not db.has_columns("MPI_RANKS", ("globalTid", "rank")):
        return {}
    df = db.read("MPI_RANKS", ("globalTid", "rank"))
    tid, r = db.ints(df, "MPI_RANKS", "globalTid"), db.ints(df, "MPI_RANKS", "rank")
    return _unique_per_proc((int(t) // _PROC_SHIFT, int(x)) for t, x in zip(tid.tolist(), r.tolist(), strict=True)
                            if t is not pd.NA and x is not pd.NA)


def _nvtx_ranks(db: _Db, strings: dict[int, str]) -> dict[int, int]:
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
            pairs.append((int(str(gtid)) // _PROC_SHIFT, int(m.group(1))))
    return _unique_per_proc(pairs)


def _gpu_names(db: _Db, table: pd.DataFrame) -> dict[int, str]:
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


def _syncs(db: _Db, act: pd.DataFrame, runtime: pd.DataFrame, rank_of: dict[int, int],
           skipped: dict[str, int]) -> pd.DataFrame | None:
    exact = (db.has_columns(SYNCHRONIZATION, ("streamId", "eventId", "correlationId"))
             and db.has_columns(CUDA_EVENT, ("streamId", "eventId", "correlationId")))
    rows = _exact_syncs(db, act, runtime, rank_of, skipped) if exact else _inferred_syncs(act, runtime, skipped)
    if rows is None:
        return None
    rows = rows.loc[rows["proc"].map(lambda x: int(x) in rank_of)]
    out = pd.DataFrame({
        "rank": pd.array([rank_of[int(x)] for x in rows["proc"].tolist()], dtype="Int64"),
        "waiting_stream": pd.array(rows["waiting_stream"].tolist(), dtype="Int64"),
        "waiting_after_s": rows["wait_ns"].to_numpy(dtype=float) * _NS,
        "recorded_correlation": pd.array(rows["recorded_correlation"].tolist(), dtype="Int64"),
        "inferred": np.full(len(rows), not exact, dtype=bool),
    })
    return out.sort_values(["rank", "waiting_after_s"], kind="stable").reset_index(drop=True)


def _count(skipped: dict[str, int], key: str, n: int) -> None:
    if n:
        skipped[key] = skipped.get(key, 0) + n


def _asof(left: pd.DataFrame, right: pd.DataFrame, on: str, by: list[str], direction: str) -> pd.DataFrame:
    """merge_asof on int64 keys with strictly earlier/later matches (pandas needs both sides sorted)."""
    left = left.assign(**{on: left[on].astype("int64")}).sort_values(on, kind="stable")
    right = right.assign(**{on: right[on].astype("int64")}).sort_values(on, kind="stable")
    for b in by:
        left[b] = left[b].astype("int64")
        right[b] = right[b].astype("int64")
    return pd.merge_asof(left, right, on=on, by=by, direction="backward" if direction == "backward" else "forward",
                         allow_exact_matches=False)


def _exact_syncs(db: _Db, act: pd.DataFrame, runtime: pd.DataFrame, rank_of: dict[int, int],
                 skipped: dict[str, int]) -> pd.DataFrame | None:
    lone = next(iter(rank_of)) if len(rank_of) == 1 else None

    def procs(df: pd.DataFrame, table: str) -> pd.Series:
        # With one process there is nothing to tell apart (and the activity may lack globalPid).
        if "globalPid" in df.columns and lone is None:
            return (db.ints(df, table, "globalPid") // _PROC_SHIFT).astype("Int64")
        return pd.Series(pd.array([lone] * len(df), dtype="Int64"), index=df.index)

    sync = db.read(SYNCHRONIZATION, ("streamId", "eventId", "correlationId"), ("start", "globalPid", "syncType"))
    types = db.enum("ENUM_CUPTI_SYNC_TYPE")
    wait_ids = {k for k, v in types.items() if "STREAM_WAIT_EVENT" in v.upper().replace(" ", "_")} or {
        _STREAM_WAIT_EVENT}
    stype = db.ints(sync, SYNCHRONIZATION, "syncType")
    is_wait = stype.isin(list(wait_ids)).fillna(False).to_numpy(dtype=bool)
    sync = sync.loc[is_wait]
    waits = pd.DataFrame({"proc": procs(sync, SYNCHRONIZATION),
                          "waiting_stream": db.ints(sync, SYNCHRONIZATION, "streamId"),
                          "event": db.ints(sync, SYNCHRONIZATION, "eventId"),
                          "correlation": db.ints(sync, SYNCHRONIZATION, "correlationId"),
                          "sync_start": db.ints(sync, SYNCHRONIZATION, "start")})
    if waits.empty:
        return None
    host = runtime.loc[runtime["correlation"].notna(), ["proc", "correlation", "start_ns"]].drop_duplicates(
        ["proc", "correlation"])
    waits = waits.merge(host, on=["proc", "correlation"], how="left")
    waits["wait_ns"] = waits["start_ns"].fillna(waits["sync_start"])
    ok = waits[["proc", "waiting_stream", "event", "correlation", "wait_ns"]].notna().all(axis=1)
    _count(skipped, "sync: wait without stream, event or time", int((~ok).sum()))
    waits = waits.loc[ok, ["proc", "waiting_stream", "event", "correlation", "wait_ns"]]

    ev = db.read(CUDA_EVENT, ("streamId", "eventId", "correlationId"), ("globalPid",))
    records = pd.DataFrame({"proc": procs(ev, CUDA_EVENT), "event": db.ints(ev, CUDA_EVENT, "eventId"),
                            "record_stream": db.ints(ev, CUDA_EVENT, "streamId"),
                            "correlation": db.ints(ev, CUDA_EVENT, "correlationId")}).dropna()
    records["record_corr"] = records["correlation"]
    paired = _asof(waits, records, "correlation", ["proc", "event"], "backward")
    found = paired["record_corr"].notna()
    _count(skipped, "sync: wait on an event recorded before the trace", int((~found).sum()))
    paired = paired.loc[found].drop(columns=["correlation"]).rename(columns={"record_corr": "correlation"})

    launched = act.loc[act["correlation"].notna(), ["proc", "stream", "correlation"]].rename(
        columns={"stream": "record_stream"})
    launched = launched.assign(recorded_correlation=launched["correlation"])
    done = _asof(paired, launched, "correlation", ["proc", "record_stream"], "backward")
    found = done["recorded_correlation"].notna()
    _count(skipped, "sync: event recorded on an idle stream", int((~found).sum()))
    return done.loc[found]


def _inferred_syncs(act: pd.DataFrame, runtime: pd.DataFrame, skipped: dict[str, int]) -> pd.DataFrame | None:
    calls = runtime.loc[runtime["tid"].notna() & runtime["start_ns"].notna()]
    waits = calls.loc[calls["call"] == "wait", ["proc", "tid", "start_ns"]].rename(columns={"start_ns": "t"})
    if waits.empty:
        return None
    records = calls.loc[calls["call"] == "record", ["tid", "start_ns"]].rename(columns={"start_ns": "t"})
    records = records.assign(record_t=records["t"])
    launched = act.loc[act["tid"].notna() & act["launch_ns"].notna() & act["correlation"].notna(),
                       ["tid", "launch_ns", "stream", "correlation"]].rename(columns={"launch_ns": "t"})
    paired = _asof(waits.assign(wait_ns=waits["t"]), records, "t", ["tid"], "backward")
    found = paired["record_t"].notna()
    _count(skipped, "sync: wait without an earlier event record", int((~found).sum()))
    paired = paired.loc[found]
    # The record's stream is taken as the one the thread launched on last before recording.
    before = _asof(paired.assign(t=paired["record_t"]), launched.rename(
        columns={"stream": "record_stream", "correlation": "recorded_correlation"}), "t", ["tid"], "backward")
    after = _asof(before.assign(t=before["wait_ns"]), launched.rename(
        columns={"stream": "waiting_stream", "correlation": "next_correlation"}), "t", ["tid"], "forward")
    ok = after["recorded_correlation"].notna() & after["waiting_stream"].notna()
    _count(skipped, "sync: no launch around the event record or wait", int((~ok).sum()))
    after = after.loc[ok]
    same = (after["record_stream"] == after["waiting_stream"]).to_numpy(dtype=bool)
    _count(skipped, "sync: inferred streams equal", int(same.sum()))
    return after.loc[~same]


# -- cuda_gpu_trace CSV ---------------------------------------------------------------------------


def __getattr__(name: str) -> object:
    """``load_nsys_csv`` moved to :mod:`ovsim.traces.nsys_csv`; it is still found here."""
    if name == "load_nsys_csv":
        from ovsim.traces.nsys_csv import load_nsys_csv

        return load_nsys_csv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
