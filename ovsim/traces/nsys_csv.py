"""Nsight Systems' ``nsys stats --report cuda_gpu_trace --format csv`` report, into the canonical
kernel table (NVIDIA's Post-Collection Analysis Guide, "cuda_gpu_trace";
https://docs.nvidia.com/nsight-systems/AnalysisGuide/index.html).

Both header variants are read by column name: nsys 2024-2026 (``...,Throughput (MB/s),SrcMemKd,DstMemKd,
Device,Ctx,GreenCtx,Strm,Name``) and the older one without ``GreenCtx`` (``Throughput (MBps)``).
Preamble lines (``Processing [...]``, ``NOTICE:``) are skipped up to the header, and reading stops at
the first blank line or next report. Times take their unit from the header (``Start (ns)``, or
``us``/``ms``/``s`` with ``--timeunit``); ``StcSMem``/``DymSMem``/``Bytes`` are decimal MB (so shared
memory and sizes are only as exact as the printed digits). ``Device`` is ``<name> (<id>)``. Copies
``[CUDA memcpy Host-to-Device]`` (or older ``[CUDA memcpy HtoD]``) and ``[CUDA memset]`` are renamed
as above. The report has no process, host-call or sync columns: ``launch_s`` is unknown, the rank is
the ``rank`` argument, else ``rank<N>`` in the file name, else 0, and there are no syncs.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ovsim.errors import OvsimError
from ovsim.traces.nsys import (
    _GRID_OUT,
    _copy_kind_from_text,
    _copy_name,
    _existing_file,
    _finish,
    _most_common,
    rank_from_name,
)
from ovsim.traces.nsys_db import count_skipped
from ovsim.traces.table import TraceBundle

_TIME_UNITS = {"ns": 1e-9, "nsec": 1e-9, "us": 1e-6, "usec": 1e-6, "μs": 1e-6, "µs": 1e-6, "ms": 1e-3, "msec": 1e-3,
               "s": 1.0, "sec": 1.0}
_SIZE_UNITS = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024.0, "mib": 1024.0**2, "gib": 1024.0**3}
_CSV_REQUIRED = ("Start", "Duration", "Strm", "Name")
_HEADER = re.compile(r"^\s*([^(]*?)\s*(?:\(([^)]*)\))?\s*$")
_DEVICE = re.compile(r"^(.*?)\s*\((\d+)\)\s*$")


def _header_cells(cells: list[str]) -> dict[str, tuple[int, str]]:
    """Column key (the header text before its unit) -> (index, unit)."""
    out: dict[str, tuple[int, str]] = {}
    for i, cell in enumerate(cells):
        m = _HEADER.match(cell)
        if m:
            out.setdefault(m.group(1), (i, (m.group(2) or "").strip()))
    return out


_THOUSANDS = r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?"


def _csv_numbers(cells: pd.Series, lines: np.ndarray, src: str, field: str) -> np.ndarray:
    """Floats from report cells: empty and ``n/a`` are NaN, ``1,234`` thousands separators allowed;
    anything else is an error naming the line."""
    text = cells.astype(str).str.strip()
    blank = text.isin(["", "n/a", "N/A", "nan", "-"])
    text = text.where(~text.str.fullmatch(_THOUSANDS), text.str.replace(",", "", regex=False))
    values = pd.to_numeric(text.where(~blank, "nan"), errors="coerce").to_numpy(dtype=float)
    bad = np.isnan(values) & ~blank.to_numpy(dtype=bool)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise OvsimError(f"line {lines[i]}: cannot read {text.iloc[i]!r} as a number", source=src, field=field)
    return values


def _csv_ints(cells: pd.Series, lines: np.ndarray, src: str, field: str) -> pd.Series:
    v = _csv_numbers(cells, lines, src, field)
    frac = np.isfinite(v) & (v != np.round(v))
    if frac.any():
        i = int(np.flatnonzero(frac)[0])
        raise OvsimError(f"line {lines[i]}: {cells.iloc[i]!r} is not a whole number", source=src, field=field)
    known = np.isfinite(v)
    return pd.Series(pd.arrays.IntegerArray(np.where(known, v, 0).astype(np.int64), ~known))


def load_nsys_csv(path: str | Path, *, rank: int | None = None) -> TraceBundle:
    """Read ``nsys stats --report cuda_gpu_trace --format csv`` output (see the module docstring)."""
    p, src = _existing_file(path)
    try:
        return _read_csv(p, src, rank)
    except csv.Error as e:
        raise OvsimError(f"not readable as CSV: {e}", source=src, field="file") from None


def _read_csv(p: Path, src: str, rank: int | None) -> TraceBundle:
    try:
        text = p.read_text(encoding="utf-8-sig", errors="replace")
    except OSError as e:
        raise OvsimError(f"cannot read: {e.strerror}", source=src, field="path") from None
    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines):
        cells = next(csv.reader([line]), [])
        if cells and cells[0].strip().startswith("Start") and "Name" in _header_cells(cells):
            start = i
            break
    if start is None:
        first = next((ln for ln in lines if ln.strip() and not ln.startswith(("Processing", "NOTICE"))), "")
        what = f" (first line: {first[:80]!r})" if first else " (the file is empty)"
        raise OvsimError(f"no cuda_gpu_trace header{what}; expected 'Start (ns),Duration (ns),CorrId,...,Strm,Name' "
                         "from `nsys stats --report cuda_gpu_trace --format csv`", source=src, field="header")
    header_cells = next(csv.reader([lines[start]]))
    header = _header_cells(header_cells)
    for c in _CSV_REQUIRED:
        if c not in header:
            raise OvsimError("cuda_gpu_trace column missing from the header", source=src, field=c)
    time_scale = {}
    for c in ("Start", "Duration"):
        unit = header[c][1] or "ns"
        if unit not in _TIME_UNITS:
            raise OvsimError(f"unknown time unit {unit!r}", source=src, field=f"{c} ({unit})")
        time_scale[c] = _TIME_UNITS[unit]
    size_scale = {}
    for c in ("StcSMem", "DymSMem", "Bytes"):
        if c in header:
            unit = header[c][1].lower() or "b"
            if unit not in _SIZE_UNITS:
                raise OvsimError(f"unknown size unit {header[c][1]!r}", source=src, field=f"{c} ({header[c][1]})")
            size_scale[c] = _SIZE_UNITS[unit]

    width = len(header_cells)
    name_at = header["Name"][0]
    end = next((i for i in range(start + 1, len(lines))
                if not lines[i].strip() or lines[i].startswith(("Processing [", "NOTICE"))), len(lines))
    rows = list(csv.reader(lines[start + 1:end]))
    for k, cells in enumerate(rows):
        if len(cells) > width and name_at == width - 1:
            # A kernel name with commas that was not quoted: the name is the last column.
            rows[k] = [*cells[:name_at], ",".join(cells[name_at:])]
        elif len(cells) != width:
            raise OvsimError(f"line {start + 2 + k}: {len(cells)} fields, the header has {width}", source=src,
                             field="Name")
    df = pd.DataFrame(rows, columns=range(width), dtype=object) if rows else pd.DataFrame(columns=range(width))
    line_no = np.arange(start + 2, start + 2 + len(rows))
    blank = pd.Series([""] * len(df), dtype=object)

    def col(key: str) -> pd.Series:
        return df[header[key][0]].reset_index(drop=True) if key in header else blank

    def nums(key: str, scale: float = 1.0) -> np.ndarray:
        return _csv_numbers(col(key), line_no, src, key) * scale

    def whole(key: str) -> pd.Series:
        return _csv_ints(col(key), line_no, src, key)

    t0, dur = nums("Start", time_scale["Start"]), nums("Duration", time_scale["Duration"])
    stream = whole("Strm")
    names = [str(n).strip() for n in col("Name").tolist()]
    src_kind = [str(x).strip() for x in col("SrcMemKd").tolist()]
    dst_kind = [str(x).strip() for x in col("DstMemKd").tolist()]
    kinds, copy_kinds = [""] * len(df), [""] * len(df)
    for i, name in enumerate(names):
        low = name.lower()
        if name.startswith("[") and "memcpy" in low:
            kinds[i], copy_kinds[i] = "copy", _copy_kind_from_text(name.strip("[] "))
            names[i] = _copy_name(copy_kinds[i], src_kind[i], dst_kind[i])
        elif name.startswith("[") and "memset" in low:
            kinds[i] = "memset"
            mem = src_kind[i] or dst_kind[i]
            names[i] = f"Memset ({mem})" if mem else "Memset"
    is_mem = np.array([k != "" for k in kinds], dtype=bool)
    nbytes = nums("Bytes", size_scale["Bytes"]) if "Bytes" in size_scale else np.full(len(df), np.nan)
    smem_parts = [nums(c, size_scale[c]) for c in ("StcSMem", "DymSMem") if c in size_scale]
    smem = np.nansum(smem_parts, axis=0) if smem_parts else np.full(len(df), np.nan)
    smem_known = np.isfinite(smem_parts).any(axis=0) if smem_parts else np.zeros(len(df), dtype=bool)
    smem_ints: list[Any] = [int(np.rint(x)) if k else pd.NA
                            for x, k in zip(np.asarray(smem).tolist(), np.asarray(smem_known).tolist(), strict=True)]
    devices: dict[int, str] = {}
    device: list[Any] = []
    for text in col("Device").tolist():
        m = _DEVICE.match(str(text))
        if m:
            devices.setdefault(int(m.group(2)), m.group(1).strip())
            device.append(int(m.group(2)))
        else:
            device.append(int(str(text).strip()) if str(text).strip().isdigit() else pd.NA)

    act = pd.DataFrame({
        "start_s": t0, "duration_s": dur, "correlation": whole("CorrId"), "stream": stream, "name": names,
        "kind": kinds, "copy_kind": copy_kinds, "bytes": np.where(is_mem, nbytes, np.nan),
        "device": pd.array(device, dtype="Int64"), "registers_per_thread": whole("Reg/Trd"),
        "shared_mem_bytes": pd.array(smem_ints, dtype="Int64"),
        **{out: whole(key) for key, out in zip(("GrdX", "GrdY", "GrdZ", "BlkX", "BlkY", "BlkZ"), _GRID_OUT,
                                               strict=True)},
    })
    skipped: dict[str, int] = {}
    missing = (~np.isfinite(t0) | ~np.isfinite(dur) | stream.isna().to_numpy(dtype=bool))
    count_skipped(skipped, "missing start, end or stream", int(missing.sum()))
    negative = ~missing & (np.nan_to_num(dur) < 0)
    count_skipped(skipped, "negative duration", int(negative.sum()))
    act = act.loc[~missing & ~negative].reset_index(drop=True)

    r = rank if rank is not None else rank_from_name(p)
    r = 0 if r is None else int(r)
    act["rank"] = r
    table = _finish(act, src)
    dev = _most_common(int(x) for x in table["device"].dropna().tolist())
    gpu = {devices[dev]} if dev is not None and dev in devices else set(devices.values())
    gpu_names = {r: next(iter(gpu))} if len(gpu) == 1 else {}
    return TraceBundle(kernels=table, gpu_names=gpu_names, sources={r: src}, skipped=skipped)
