"""One PyTorch profiler (Kineto) trace file read into columns: its events parsed slice by slice, its
GPU activities' fields, host operators, copy kinds and stream waits, before :mod:`ovsim.traces.kineto`
settles ranks and clocks across files. The format and what is read are stated there."""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np
import orjson
import pandas as pd

from ovsim.errors import OvsimError
from ovsim.traces.json_slices import (
    WholeParse,
    json_type,
    loads,
    parse_sliced,
    skip_ws,
)
from ovsim.traces.kineto_comm import _I64_MAX, _I64_MIN, _collectives, _hashable, _innermost, _int, _ints
from ovsim.traces.table import (
    classify,
)

# Longer events are corrupt records (HTA drops them too, past its MAX_EVENT_DURATION_US).
_MAX_DURATION_US = 1e9
_COPY_KIND = re.compile(r"\b(HtoD|DtoH|DtoD|PtoP|HtoH)\b")
_COPY_KINDS = ("HtoD", "DtoH", "DtoD", "PtoP", "HtoH")

_KERNEL, _MEMCPY, _MEMSET, _RUNTIME, _CPU_OP, _SYNC = 1, 2, 3, 4, 5, 6
_ROLES = {"kernel": _KERNEL, "gpu_memcpy": _MEMCPY, "memcpy": _MEMCPY, "gpu_memset": _MEMSET, "memset": _MEMSET,
          "cuda_runtime": _RUNTIME, "cuda_driver": _RUNTIME, "cpu_op": _CPU_OP, "cuda_sync": _SYNC}
_EMPTY: dict[str, Any] = {}

# Row tuple layout (one per GPU activity, filled in the event loop).
(_DEV, _STREAM, _CORR, _NAME, _KIND, _TS, _DUR, _GX, _GY, _GZ, _BX, _BY, _BZ, _REGS, _SMEM, _BYTES, _EXT,
 _HINT, _COMM) = range(19)
_NFIELDS = 19


@dataclass
class FileData:
    """What one rank file contributes, before ranks and clocks are settled across files."""

    source: str
    name: str
    rank: int | None
    world_size: int | None
    base_ns: int | None
    gpu_name: str | None
    versions: dict[str, str]
    columns: dict[str, Any]
    n: int
    syncs: list[tuple[int, float, int, int]]
    skipped: dict[str, int]


@dataclass
class _State:
    """Accumulated by the event loop over one file's slices."""

    roles: dict[Any, int] = field(default_factory=lambda: dict(_ROLES))
    # Kernel name -> (the one copy of the name kept, its kind): the names repeat, and one str
    # object per row would be most of the rows' memory.
    kinds: dict[str, tuple[str, str]] = field(default_factory=dict)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    # Host launch calls: correlation -> (ts, External id, pid, tid).
    launches: dict[int, tuple[Any, Any, Any, Any]] = field(default_factory=dict)
    # record_param_comms ops with metadata: by External id, and by (pid, tid) as (start, end, args).
    rpc_by_ext: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Operators recorded with their input shapes (record_shapes): External id -> ((operator with its
    # shapes, input types) as text, External id).
    host_ops: dict[int, tuple[tuple[str, str], Any]] = field(default_factory=dict)
    # The same operators per host thread as (start, end, texts, External id), for traces whose
    # kernels link to their launch call only by time (older Kineto: a kernel's External id is its
    # correlation).
    host_spans: dict[tuple[Any, Any], list[tuple[float, float, tuple[str, str], Any]]] = field(default_factory=dict)
    # (name, Input Dims as JSON, Input type as JSON) -> the texts of host_ops, shared.
    op_texts: dict[tuple[str, bytes, bytes], tuple[str, str]] = field(default_factory=dict)
    rpc_by_thread: dict[tuple[Any, Any], list[tuple[float, float, dict[str, Any]]]] = field(default_factory=dict)
    # (device, waiting stream, wait ts, record correlation, recording stream)
    waits: list[tuple[Any, Any, Any, int, Any]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)

    def scan(self, events: list[Any]) -> None:
        """One pass over events; the hot loop of the importer, so it avoids calls per event."""
        roles, rows, kinds, launches, skipped = self.roles, self.rows, self.kinds, self.launches, self.skipped
        for e in events:
            if e.__class__ is not dict:
                skipped["event is not an object"] += 1
                continue
            cat = e.get("cat")
            if cat.__class__ is not str:
                if cat is not None:
                    skipped["event with a malformed cat"] += 1
                continue
            role = roles.get(cat)
            if role is None:
                role = roles[cat] = _ROLES.get(cat.lower(), 0)
            if not role:
                continue
            if e.get("ph") != "X":
                if role <= _MEMSET:
                    skipped["GPU event that is not a complete (ph X) event"] += 1
                continue
            args = e.get("args")
            if args.__class__ is not dict:
                args = _EMPTY
            ts = e.get("ts")
            tsc = ts.__class__
            if role <= _MEMSET:
                if tsc is not float and tsc is not int:
                    skipped["missing ts" if ts is None else "malformed ts"] += 1
                    continue
                dur = e.get("dur")
                if dur.__class__ is not float and dur.__class__ is not int:
                    skipped["missing dur" if dur is None else "malformed dur"] += 1
                    continue
                if dur < 0:
                    skipped["negative duration"] += 1
                    continue
                if dur > _MAX_DURATION_US:
                    skipped["duration over 1e9 us"] += 1
                    continue
                name = e.get("name")
                if name.__class__ is not str:
                    skipped["missing name" if name is None else "malformed name"] += 1
                    continue
                stream = args.get("stream")
                if stream is None:
                    stream = e.get("tid")
                if stream.__class__ is not int or not _I64_MIN <= stream <= _I64_MAX:
                    skipped["no stream"] += 1
                    continue
                device = args.get("device")
                if device is None:
                    device = e.get("pid")
                hint = comm = None
                known = kinds.get(name)
                if known is None:
                    known = kinds[name] = (name, classify(name) if role == _KERNEL else "")
                name = known[0]
                if role == _KERNEL:
                    kind = known[1]
                    grid, block = args.get("grid"), args.get("block")
                    bad = "grid" if not _launch_dims(grid) else "block" if not _launch_dims(block) else ""
                    if bad:
                        skipped[f"malformed {bad}"] += 1
                        continue
                    gx, gy, gz = grid if grid is not None else (None, None, None)
                    bx, by, bz = block if block is not None else (None, None, None)
                    if "Collective name" in args or "In msg nelems" in args or "Seq" in args:
                        comm = args
                else:
                    kind = "copy" if role == _MEMCPY else "memset"
                    gx = gy = gz = bx = by = bz = None
                    if role == _MEMCPY:
                        hint = args.get("kind")
                rows.append((device, stream, args.get("correlation"), name, kind, ts, dur, gx, gy, gz, bx, by, bz,
                             args.get("registers per thread"), args.get("shared memory"), args.get("bytes"),
                             args.get("External id"), hint, comm))
            elif role == _RUNTIME:
                corr = args.get("correlation")
                if corr.__class__ is int and (tsc is float or tsc is int) and corr not in launches:
                    launches[corr] = (ts, args.get("External id"), e.get("pid"), e.get("tid"))
            elif role == _CPU_OP:
                if e.get("name") == "record_param_comms" and ("Collective name" in args or "In msg nelems" in args):
                    self._add_rpc(e, args, ts)
                dims = args.get("Input Dims")
                if dims is not None:
                    ext = args.get("External id")
                    texts = self._op_texts(e.get("name"), dims, args.get("Input type"))
                    if ext.__class__ is int:
                        self.host_ops[ext] = (texts, ext)
                    dur = e.get("dur")
                    if isinstance(ts, int | float) and isinstance(dur, int | float):
                        key = (_hashable(e.get("pid")), _hashable(e.get("tid")))
                        self.host_spans.setdefault(key, []).append((float(ts), float(ts) + dur, texts, ext))
            elif role == _SYNC:
                rec = args.get("wait_on_cuda_event_record_corr_id")
                if rec.__class__ is int and (tsc is float or tsc is int):
                    stream = args.get("stream")
                    device = args.get("device")
                    self.waits.append((e.get("pid") if device is None else device,
                                       e.get("tid") if stream is None else stream, ts, rec,
                                       args.get("wait_on_stream")))

    def _op_texts(self, name: Any, dims: Any, types: Any) -> tuple[str, str]:
        """The operator with its input shapes, e.g. ``aten::mm[[64, 128], [128, 256]]``, and its input
        types as text, one shared tuple per distinct operator record: holding the parsed lists of
        every call instead was most of the importer's memory. A value's compact JSON keys its text
        (equal JSON, equal text), which is cheaper to make than the text itself."""
        key = (f"{name}", orjson.dumps(dims), orjson.dumps(types))
        texts = self.op_texts.get(key)
        if texts is None:
            texts = (f"{name}{dims}"[:500], "" if types is None else f"{types}"[:500])
            # orjson's bytes keep a 4 KiB buffer whatever their length: keep exact-size copies.
            self.op_texts[(key[0], bytes(memoryview(key[1])), bytes(memoryview(key[2])))] = texts
        return texts

    def _add_rpc(self, e: dict[str, Any], args: dict[str, Any], ts: Any) -> None:
        ext = args.get("External id")
        if ext.__class__ is int:
            self.rpc_by_ext.setdefault(ext, args)
        dur = e.get("dur")
        if ts.__class__ in (int, float) and dur.__class__ in (int, float):
            key = (_hashable(e.get("pid")), _hashable(e.get("tid")))
            self.rpc_by_thread.setdefault(key, []).append((float(ts), float(ts) + float(dur), args))


def _launch_dims(dims: Any) -> bool:
    """A kernel's grid or block as CUDA takes it: absent, or three whole numbers from 1 to 2^31 - 1."""
    if dims is None:
        return True
    return (dims.__class__ is list and len(dims) == 3
            and all(d.__class__ is int and 1 <= d < 2**31 for d in dims))


# -- parsing one file (reading files and slicing their JSON: json_slices.py) ------------------------


def parse_file(source: str, name: str, raw: bytes) -> FileData:
    if raw[:3] == b"\xef\xbb\xbf":
        raw = raw[3:]
    first = skip_ws(raw, 0)
    if first >= len(raw):
        raise OvsimError("empty file", source=source, field="json")
    state = _State()
    meta: dict[str, Any] | None = None
    if raw[first] == ord("{"):
        try:
            meta = parse_sliced(raw, state.scan)
        except WholeParse:
            state = _State()
    if meta is None:
        doc = loads(raw, source)
        if not isinstance(doc, dict):
            raise OvsimError(f"the top-level JSON value is {json_type(doc)}, not an object", source=source,
                             field="traceEvents")
        events = doc.get("traceEvents")
        if events is None:
            raise OvsimError("no traceEvents: not a Chrome trace", source=source, field="traceEvents")
        if not isinstance(events, list):
            raise OvsimError(f"traceEvents is {json_type(events)}, not a list", source=source, field="traceEvents")
        state.scan(events)
        del doc["traceEvents"]
        meta = doc
    del raw
    return _file_data(source, name, meta, state)


# -- one file's columns ----------------------------------------------------------------------------

def _meta_int(meta: dict[str, Any], section: str, key: str, source: str) -> int | None:
    holder = meta.get(section)
    if holder is None:
        return None
    if not isinstance(holder, dict):
        raise OvsimError(f"{section} is {json_type(holder)}, not an object", source=source, field=section)
    v = holder.get(key)
    if v is None:
        return None
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**31:
        raise OvsimError(f"not a non-negative integer: {v!r}", source=source, field=f"{section}.{key}")
    return v


def _base_ns(meta: dict[str, Any], source: str) -> int | None:
    v = meta.get("baseTimeNanoseconds")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise OvsimError(f"not a number: {v!r}", source=source, field="baseTimeNanoseconds")
    return int(v)


# Metadata keys that name software versions (PyTorch profiler writes CUDA's as integers, 12040 = 12.4).
_VERSION_KEYS = ("cuda_runtime_version", "cuda_driver_version", "cupti_version", "hip_runtime_version",
                 "hip_driver_version", "roctracer_version")


def _versions(meta: dict[str, Any]) -> dict[str, str]:
    dist = meta.get("distributedInfo")
    found = [(k, meta.get(k)) for k in _VERSION_KEYS]
    if isinstance(dist, dict):
        found += [(k, dist.get(k)) for k in ("nccl_version", "backend")]
    return {k: str(v) for k, v in found if isinstance(v, str | int | float) and not isinstance(v, bool)}


def _device_names(meta: dict[str, Any]) -> dict[int, str]:
    props = meta.get("deviceProperties")
    names: dict[int, str] = {}
    if isinstance(props, list):
        for i, p in enumerate(props):
            if isinstance(p, dict) and isinstance(p.get("name"), str):
                dev = p.get("id")
                names.setdefault(dev if isinstance(dev, int) and not isinstance(dev, bool) else i, p["name"])
    return names


def _file_data(source: str, name: str, meta: dict[str, Any], st: _State) -> FileData:
    rows = st.rows
    # Sorted by start within the file, so that files joined in rank order come out sorted by
    # (rank, start) without sorting the table.
    rows.sort(key=itemgetter(_TS))
    n = len(rows)
    cols: list[tuple[Any, ...]] = list(zip(*rows, strict=True)) if rows else [()] * _NFIELDS
    del st.rows
    names: tuple[str, ...] = cols[_NAME]
    kinds = list(cols[_KIND])
    corr_list = [_int(c) for c in cols[_CORR]]
    corr = _ints(corr_list)
    launch = np.full(n, np.nan)
    launches = st.launches
    for i, c in enumerate(corr_list):
        if c is not None:
            hit = launches.get(c)
            if hit is not None:
                launch[i] = hit[0]
    copy_kind = _copy_kinds(names, kinds, cols[_HINT])
    host_op, host_types, host_op_id = _host_ops(st, cols[_EXT], corr_list)
    coll = _collectives(st, names, kinds, cols[_EXT], corr_list, cols[_COMM])
    columns: dict[str, Any] = {
        "device": _ints(cols[_DEV]), "stream": _ints(cols[_STREAM]), "correlation": corr, "name": list(names),
        "kind": kinds, "ts_us": np.array(cols[_TS], dtype=np.float64), "duration_s": _floats(cols[_DUR]) / 1e6,
        "launch_us": launch,
        "grid_x": _ints(cols[_GX]), "grid_y": _ints(cols[_GY]), "grid_z": _ints(cols[_GZ]),
        "block_x": _ints(cols[_BX]), "block_y": _ints(cols[_BY]), "block_z": _ints(cols[_BZ]),
        "registers_per_thread": _ints(cols[_REGS]), "shared_mem_bytes": _ints(cols[_SMEM]),
        "bytes": _floats(cols[_BYTES]), "copy_kind": copy_kind, "host_op": host_op,
        "host_types": host_types, "host_op_id": _ints(host_op_id), **coll,
    }
    return FileData(
        source=source, name=name, rank=_meta_int(meta, "distributedInfo", "rank", source),
        world_size=_meta_int(meta, "distributedInfo", "world_size", source), base_ns=_base_ns(meta, source),
        gpu_name=_gpu_name(_device_names(meta), columns["device"]), versions=_versions(meta), columns=columns, n=n,
        syncs=_resolve_waits(st, cols[_DEV], cols[_STREAM], corr_list, launch), skipped=dict(st.skipped))


def _host_ops(st: _State, ext: tuple[Any, ...], corr: list[int | None]) -> tuple[list[str], list[str], list[Any]]:
    """Per row: the launching operator and its input shapes, e.g. ``aten::mm[[64, 128], [128, 256]]``,
    its input types, e.g. ``['c10::BFloat16', 'c10::BFloat16']``, and the operator call's External id,
    where the trace recorded them; "" (None for the id) otherwise. Replay uses the shapes to tell
    problem sizes apart; calibration derives the FLOPs and bytes of a kernel from shapes and types,
    and from the id which kernels one call launched.

    The operator is the one whose External id the kernel or its launch call carries, else the
    innermost recorded operator enclosing the launch call on its thread."""
    for thread_spans in st.host_spans.values():
        thread_spans.sort(key=itemgetter(0))
    starts = {k: [sp[0] for sp in v] for k, v in st.host_spans.items()}
    ops: list[str] = []
    types: list[str] = []
    ids: list[Any] = []
    for x, c in zip(ext, corr, strict=True):
        op = st.host_ops.get(x) if x.__class__ is int else None
        launch = st.launches.get(c) if c is not None and op is None else None
        if launch is not None:
            ts, launch_ext, pid, tid = launch
            op = st.host_ops.get(launch_ext) if launch_ext.__class__ is int else None
            key = (_hashable(pid), _hashable(tid))
            spans = st.host_spans.get(key)
            if op is None and spans:
                j = _innermost(spans, starts[key], float(ts), limit=64)
                if j is not None:
                    op = spans[j][2:4]
        if op is None:
            ops.append("")
            types.append("")
            ids.append(None)
            continue
        ops.append(op[0][0])
        types.append(op[0][1])
        ids.append(op[1])
    return ops, types, ids


def _floats(values: tuple[Any, ...] | list[Any]) -> np.ndarray:
    types = set(map(type, values))
    if types <= {int, float, type(None)}:
        try:
            return np.array(values, dtype=np.float64)
        except OverflowError:
            pass
    return np.array([float(v) if v.__class__ in (int, float) and abs(v) < 1e300 else np.nan for v in values],
                    dtype=np.float64)


def _copy_kinds(names: tuple[str, ...], kinds: list[str], hints: tuple[Any, ...]) -> list[str]:
    out = [""] * len(names)
    cache: dict[str, str] = {}
    for i, k in enumerate(kinds):
        if k != "copy":
            continue
        nm = names[i]
        ck = cache.get(nm)
        if ck is None:
            m = _COPY_KIND.search(nm)
            ck = cache[nm] = m.group(1) if m else ""
        if not ck and hints[i] in _COPY_KINDS:
            ck = hints[i]
        out[i] = ck
    return out


def _resolve_waits(st: _State, devices: tuple[Any, ...], streams: tuple[Any, ...], corr: list[int | None],
                   launch_us: np.ndarray) -> list[tuple[int, float, int, int]]:
    """(waiting stream, wait ts in us, recorded activity's correlation, recording stream) per wait
    whose event was recorded after some activity."""
    if not st.waits:
        return []
    by_stream: dict[tuple[Any, Any], list[tuple[float, int]]] = {}
    for i, c in enumerate(corr):
        if c is not None and not math.isnan(launch_us[i]):
            by_stream.setdefault((_hashable(devices[i]), streams[i]), []).append((float(launch_us[i]), c))
    for v in by_stream.values():
        v.sort()
    keys = {k: [t for t, _ in v] for k, v in by_stream.items()}
    out: list[tuple[int, float, int, int]] = []
    for device, waiting, ts, rec, recording in st.waits:
        record = st.launches.get(rec)
        stream, rec_stream = _int(waiting), _int(recording)
        if record is None or stream is None or rec_stream is None:
            continue
        key = (_hashable(device), rec_stream)
        lst = by_stream.get(key)
        if not lst:
            continue
        j = bisect.bisect_right(keys[key], float(record[0])) - 1
        if j >= 0:
            out.append((stream, float(ts), lst[j][1], rec_stream))
    return out


def _gpu_name(device_names: dict[int, str], devices: pd.arrays.IntegerArray) -> str | None:
    """The name of the device most rows ran on, else of the first device listed."""
    if not device_names:
        return None
    used = devices[~devices.isna()]
    if len(used):
        values, counts = np.unique(used.to_numpy(dtype=np.int64), return_counts=True)
        name = device_names.get(int(values[np.argmax(counts)]))
        if name is not None:
            return name
    return next(iter(device_names.values()))
