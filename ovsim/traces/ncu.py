"""Nsight Compute importer: per-kernel launch configuration, resource use and isolated throughput from
``ncu --csv --page raw``, and a join that puts them on the kernel table.

Format (NVIDIA Nsight Compute CLI and Profiling Guide, https://docs.nvidia.com/nsight-compute/, and
ncu CSV fixtures in public repositories): the header row holds the identifier columns
(``ID``, ``Process ID``, ``Process Name``, ``Host Name``, ``Kernel Name``, ``Context``, ``Stream``,
``Block Size``, ``Grid Size``, ``Device``, ``CC``) and then one column per raw metric name; the second
row holds units (empty under the identifier columns); then one row per profiled launch. Lines before
the header (``==PROF==`` messages, program output) and ``==...`` lines after the data are skipped.
A file without the units row is refused (its units would be guesses), as is the ``--page details``
layout.

Numbers are read in the locale ncu printed them in: ``1,234.5`` (thousands commas) unless some value
in the file shows the European form (``27.595.520`` or ``1.234,5``), in which case ``.`` separates
thousands and ``,`` decimals for the whole file. ``n/a`` and empty cells are unknown.

Columns of :func:`load_ncu_csv` (units after conversion):

- ``id`` (ncu's profiled-launch index, not a CUDA correlation id), ``process_id``, ``process``,
  ``name`` (``Kernel Name``, as ``--print-kernel-base`` chose), ``context``, ``stream``, ``device``,
  ``cc`` (compute capability, text)
- ``grid_x``.. ``grid_z``, ``block_x``.. ``block_z``: from the ``Grid Size``/``Block Size`` tuples
- ``registers_per_thread`` (``launch__registers_per_thread``)
- ``shared_mem_bytes``: bytes per block, ``launch__shared_mem_per_block_static`` + ``..._dynamic``
  (the driver's reserved share is not included, as in the nsys/Kineto tables)
- ``blocks`` (``launch__grid_size``, total blocks), ``threads_per_block`` (``launch__block_size``)
- ``ncu_duration_s``: ``gpu__time_duration.sum`` in seconds. ncu replays each kernel serialized, at
  its clock-control setting, so this is the kernel's *isolated* time, not its time in an overlapped run.
- ``sm_throughput_pct`` (``sm__throughput.avg.pct_of_peak_sustained_elapsed``),
  ``memory_throughput_pct`` (``gpu__compute_memory_throughput...``), ``dram_throughput_pct``
  (``dram__throughput...``, else ``gpu__dram_throughput...``), ``l2_throughput_pct``
  (``lts__throughput...``), ``tensor_pipe_pct`` (``sm__pipe_tensor_cycles_active...``): percent of peak
- ``dram_bytes_read``, ``dram_bytes_write`` (``dram__bytes_read.sum``, ``dram__bytes_write.sum``): bytes
- ``achieved_occupancy_pct`` (``sm__warps_active.avg.pct_of_peak_sustained_active``, measured),
  ``theoretical_occupancy_pct`` (``sm__maximum_warps_per_active_cycle_pct``): percent
- ``waves_per_sm`` (``launch__waves_per_multiprocessor``)

A metric the file lacks is left unknown. Time units ``nsecond``/``usecond``/``msecond``/``second``
(and ``ns``/``us``/``ms``/``s``) and byte units ``byte``/``Kbyte``/``Mbyte``/``Gbyte``/``Tbyte``
(decimal; ``Kibyte``.. binary, optionally ``/block``) are converted; any other unit on a time or byte
metric is an error. Values in scaled units are only as exact as their printed digits (``--csv`` prints
base units unless ``--print-units auto`` is given).

Matching (:func:`join_ncu`): a kernel's signature is its name and launch configuration (grid and
block). Names are compared in full (whitespace collapsed, a leading ``void`` dropped); an ncu name
that is a bare function name (what ``--print-kernel-base function`` prints: no namespace, template
arguments or parameters) matches the table names whose base function name it is, when the table name
has no full match. Mangled ncu names (``--print-kernel-base mangled``) match nothing. The
configuration is part of the signature when ncu has it for every row and the table row has it;
table rows without one match by name alone. Within each rank of the table, for each signature: when the table and ncu
hold the same number of launches, the k-th launch in the table (in host launch order: ``launch_s``,
else ``correlation``, else ``start_s``) takes the k-th ncu row (in ``id`` order); when the counts
differ (ncu usually profiles a subset), every launch takes the median of the signature's ncu rows.
ncu processes are not mapped to ranks: every rank matches against all ncu rows.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ovsim.errors import OvsimError
from ovsim.gcpause import paused_gc

_IDENT = {"ID": "id", "Process ID": "process_id", "Process Name": "process", "Kernel Name": "name",
          "Context": "context", "Stream": "stream", "Device": "device", "CC": "cc"}
_IDENT_INT = ("id", "process_id", "context", "stream", "device")
_TUPLES = {"Grid Size": ("grid_x", "grid_y", "grid_z"), "Block Size": ("block_x", "block_y", "block_z")}

# (output column, raw metric names with the first present one used, unit kind)
_METRICS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("registers_per_thread", ("launch__registers_per_thread",), "count"),
    ("smem_static", ("launch__shared_mem_per_block_static",), "bytes"),
    ("smem_dynamic", ("launch__shared_mem_per_block_dynamic",), "bytes"),
    ("blocks", ("launch__grid_size",), "count"),
    ("threads_per_block", ("launch__block_size",), "count"),
    ("ncu_duration_s", ("gpu__time_duration.sum",), "time"),
    ("sm_throughput_pct", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",), "pct"),
    ("memory_throughput_pct", ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",), "pct"),
    ("dram_throughput_pct", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                             "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"), "pct"),
    ("l2_throughput_pct", ("lts__throughput.avg.pct_of_peak_sustained_elapsed",), "pct"),
    ("tensor_pipe_pct", ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",), "pct"),
    ("dram_bytes_read", ("dram__bytes_read.sum",), "bytes"),
    ("dram_bytes_write", ("dram__bytes_write.sum",), "bytes"),
    ("achieved_occupancy_pct", ("sm__warps_active.avg.pct_of_peak_sustained_active",), "pct"),
    ("theoretical_occupancy_pct", ("sm__maximum_warps_per_active_cycle_pct",), "pct"),
    ("waves_per_sm", ("launch__waves_per_multiprocessor",), "count"),
)
_INT_METRICS = ("registers_per_thread", "smem_static", "smem_dynamic", "blocks", "threads_per_block")

CONFIG = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
# Columns join_ncu adds to the kernel table (measured by ncu, isolated replay).
MEASURED = ("ncu_duration_s", "sm_throughput_pct", "memory_throughput_pct", "dram_throughput_pct",
            "l2_throughput_pct", "tensor_pipe_pct", "dram_bytes_read", "dram_bytes_write", "achieved_occupancy_pct",
            "theoretical_occupancy_pct", "waves_per_sm")
# Columns join_ncu fills in the kernel table where they are unknown.
FILLED = (*CONFIG, "registers_per_thread", "shared_mem_bytes")
COLUMNS = ("id", "process_id", "process", "name", "context", "stream", "device", "cc", *CONFIG,
           "registers_per_thread", "shared_mem_bytes", "blocks", "threads_per_block", *MEASURED)

_TIME = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0,
         "s": 1.0}
_BYTES = re.compile(r"^(?:(K|M|G|T)(i)?)?(?:byte|B)(?:/block)?$", re.IGNORECASE)
_PREFIX = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
_TUPLE = re.compile(r"^\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)$")
_EUROPEAN = re.compile(r"^[-+]?\d{1,3}(?:\.\d{3}){2,}(?:,\d+)?$|^[-+]?\d{1,3}(?:\.\d{3})+,\d+$")
_UNKNOWN = ("", "n/a", "N/A", "nan", "NaN")


def _unit_scale(kind: str, unit: str, src: str, field: str) -> float:
    u = unit.strip()
    if kind == "time":
        if u in _TIME:
            return _TIME[u]
    elif kind == "bytes":
        m = _BYTES.match(u)
        if m:
            base = 1024.0 if m.group(2) else 1000.0
            return base ** _PREFIX[(m.group(1) or "").upper()]
    elif kind == "pct":
        if u in ("%", ""):
            return 1.0
    else:
        return 1.0
    raise OvsimError(f"unknown unit {unit!r} for a {kind} metric", source=src, field=field)


def _number(text: str, european: bool) -> float:
    t = text.strip()
    if t in _UNKNOWN:
        return np.nan
    t = t.replace(".", "").replace(",", ".") if european else t.replace(",", "")
    return float(t)


def load_ncu_csv(path: str | Path) -> pd.DataFrame:
    """Read ``ncu --csv --page raw`` output: one row per profiled kernel launch (see the module
    docstring for the columns and their units)."""
    p, src = Path(path), str(path)
    if not p.exists():
        raise OvsimError("no such file", source=src, field="path")
    if not p.is_file():
        raise OvsimError("not a file", source=src, field="path")
    try:
        text = p.read_text(encoding="utf-8-sig", errors="replace")
    except OSError as e:
        raise OvsimError(f"cannot read: {e.strerror}", source=src, field="path") from None
    try:
        with paused_gc():
            rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:
        raise OvsimError(f"not readable as CSV: {e}", source=src, field="file") from None
    start = next((i for i, r in enumerate(rows) if r and r[0].strip() == "ID"), None)
    if start is None:
        raise OvsimError("no ncu header (a first column named \"ID\"); expected `ncu --csv --page raw` output",
                         source=src, field="header")
    header = [c.strip() for c in rows[start]]
    if "Metric Name" in header and "Metric Value" in header:
        raise OvsimError("this is the --page details layout (one row per metric); export with --page raw",
                         source=src, field="header")
    if "Kernel Name" not in header:
        raise OvsimError("column missing from the header", source=src, field="Kernel Name")
    if start + 1 >= len(rows) or rows[start + 1][:1] != [""]:
        raise OvsimError("no units row after the header (the second row must leave the identifier columns empty "
                         "and give each metric's unit)", source=src, field="units")
    units = rows[start + 1]
    data: list[tuple[int, list[str]]] = []
    for n, r in enumerate(rows[start + 2:], start=start + 3):
        if not any(c.strip() for c in r) or r[0].startswith("=="):
            continue
        if len(r) != len(header):
            raise OvsimError(f"line {n}: {len(r)} fields, the header has {len(header)}", source=src, field="ID")
        data.append((n, r))
    col = {h: i for i, h in enumerate(header)}
    metric_cols = [i for i, h in enumerate(header) if h not in _IDENT and h not in _TUPLES
                   and h not in ("Host Name",)]
    european = any(_EUROPEAN.match(r[i].strip()) for _, r in data for i in metric_cols)

    def numbers(h: str, scale: float = 1.0) -> np.ndarray:
        out = np.full(len(data), np.nan)
        i = col[h]
        for k, (n, r) in enumerate(data):
            try:
                out[k] = _number(r[i], european) * scale
            except ValueError:
                raise OvsimError(f"line {n}: cannot read {r[i]!r} as a number", source=src, field=h) from None
        return out

    def ints(values: np.ndarray, h: str) -> pd.Series:
        frac = np.isfinite(values) & (np.abs(values - np.round(values)) > 1e-6 * np.maximum(1.0, np.abs(values)))
        if frac.any():
            line = data[int(np.flatnonzero(frac)[0])][0]
            raise OvsimError(f"line {line}: not a whole number", source=src, field=h)
        return pd.Series(pd.array([int(np.rint(v)) if np.isfinite(v) else pd.NA for v in values], dtype="Int64"))

    out: dict[str, Any] = {}
    for h, name in _IDENT.items():
        if h not in col:
            out[name] = ints(np.full(len(data), np.nan), h) if name in _IDENT_INT else [""] * len(data)
        elif name in _IDENT_INT:
            out[name] = ints(numbers(h), h)
        else:
            out[name] = [r[col[h]].strip() for _, r in data]
    for h, names in _TUPLES.items():
        vals: list[list[Any]] = [[], [], []]
        for n, r in data:
            cell = r[col[h]].strip() if h in col else ""
            m = _TUPLE.match(cell)
            if not m and cell not in _UNKNOWN:
                raise OvsimError(f"line {n}: cannot read {cell!r} as '(x, y, z)'", source=src, field=h)
            for k in range(3):
                vals[k].append(int(m.group(k + 1)) if m else pd.NA)
        for k, name in enumerate(names):
            out[name] = pd.array(vals[k], dtype="Int64")
    for name, raws, kind in _METRICS:
        raw = next((r for r in raws if r in col), None)
        if raw is None:
            values = np.full(len(data), np.nan)
        else:
            unit = units[col[raw]] if col[raw] < len(units) else ""
            scale = _unit_scale(kind, unit, src, f"{raw} [{unit}]")
            values = numbers(raw, scale)
            if kind == "bytes" and scale != 1.0:
                # Auto-scaled units print a few digits ("49.15 Kbyte"): the byte count is only that exact.
                values = np.round(values)
        out[name] = ints(values, raw or name) if name in _INT_METRICS else values
    df = pd.DataFrame(out)
    df["shared_mem_bytes"] = df["smem_static"].add(df["smem_dynamic"], fill_value=0)
    df = df.drop(columns=["smem_static", "smem_dynamic"])
    return df[list(COLUMNS)].sort_values("id", kind="stable", na_position="last").reset_index(drop=True)


# -- join -------------------------------------------------------------------------------------------

def full_name_key(name: str) -> str:
    """A kernel name with whitespace collapsed and a leading ``void`` return type dropped."""
    key = " ".join(str(name).split())
    return key[5:] if key.startswith("void ") else key


def short_name_key(name: str) -> str:
    """The base function name: no return type, namespace, template arguments or parameter list."""
    text = full_name_key(name).replace("(anonymous namespace)", "anonymous_namespace")
    depth, kept = 0, []
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            kept.append(ch)
    base = "".join(kept).strip().split(" ")[-1] if "".join(kept).strip() else text
    return base.split("::")[-1]


def _launch_order(df: pd.DataFrame) -> np.ndarray:
    """Row positions of ``df`` in host launch order (ncu profiles in launch order)."""
    for c in ("launch_s", "correlation", "start_s"):
        if c in df.columns:
            v = df[c].to_numpy(dtype=float, na_value=np.nan)
            if len(v) and np.isfinite(v).all():
                order: np.ndarray = np.argsort(v, kind="stable")
                return order
    return np.arange(len(df))


def join_ncu(kernels: pd.DataFrame, ncu: pd.DataFrame) -> pd.DataFrame:
    """The kernel table with ncu's launch configuration and resources filled where it had none, and
    ncu's measured columns (:data:`MEASURED`) plus ``ncu_match`` ("launch", "median" or "" when
    unmatched) added; see the module docstring for the matching rule. The counts are in
    ``result.attrs["ncu"]``: kernels matched by launch, by median, unmatched, and ncu rows never used.
    Copies and memsets are not matched. (``validate_table`` keeps only the canonical columns.)"""
    if "name" not in kernels.columns:
        raise OvsimError("missing column", source="kernel table", field="name")
    if "name" not in ncu.columns:
        raise OvsimError("missing column", source="ncu table", field="name")
    out = kernels.reset_index(drop=True).copy()
    for c in FILLED:
        if c not in out.columns:
            out[c] = pd.array([pd.NA] * len(out), dtype="Int64")
    for c in MEASURED:
        out[c] = np.nan
    out["ncu_match"] = ""
    nc = ncu.reset_index(drop=True)
    if "id" in nc.columns:
        nc = nc.sort_values("id", kind="stable", na_position="last").reset_index(drop=True)
    for c in (*FILLED, *MEASURED):
        if c not in nc.columns:
            nc[c] = np.nan

    n_cfg = nc[list(CONFIG)].to_numpy(dtype=float, na_value=np.nan)
    use_cfg = bool(len(nc)) and bool(np.isfinite(n_cfg).all())
    by_sig: dict[tuple[Any, ...], list[int]] = {}
    for i, n in enumerate(str(x) for x in nc["name"].tolist()):
        key = _ncu_key(n)
        by_sig.setdefault((key,), []).append(i)
        if use_cfg:
            by_sig.setdefault((key, *(int(v) for v in n_cfg[i])), []).append(i)

    k_cfg = out[list(CONFIG)].to_numpy(dtype=float, na_value=np.nan)
    kinds = out["kind"].astype(str).tolist() if "kind" in out.columns else [""] * len(out)
    ranks = out["rank"].tolist() if "rank" in out.columns else [0] * len(out)
    groups: dict[tuple[Any, ...], list[int]] = {}
    n_kernels = 0
    for i, n in enumerate(str(x) for x in out["name"].tolist()):
        if kinds[i] in ("copy", "memset"):
            continue
        n_kernels += 1
        cfg = tuple(int(v) for v in k_cfg[i]) if use_cfg and np.isfinite(k_cfg[i]).all() else ()
        for key in (("full", full_name_key(n)), ("short", short_name_key(n))):
            if (key, *cfg) in by_sig:
                groups.setdefault((ranks[i], key, *cfg), []).append(i)
                break

    n_vals = {c: nc[c].to_numpy(dtype=float, na_value=np.nan) for c in (*FILLED, *MEASURED)}
    filled = {c: out[c].to_numpy(dtype=float, na_value=np.nan) for c in FILLED}
    measured = {c: np.full(len(out), np.nan) for c in MEASURED}
    match = [""] * len(out)
    used = np.zeros(len(nc), dtype=bool)
    for gkey, rows in groups.items():
        cand = by_sig[gkey[1:]]
        rows_in_order = [rows[j] for j in _launch_order(out.iloc[rows])]
        used[cand] = True
        if len(cand) == len(rows_in_order):
            for i, j in zip(rows_in_order, cand, strict=True):
                _assign(i, {c: n_vals[c][j] for c in n_vals}, filled, measured)
                match[i] = "launch"
        else:
            med = {c: _nanmedian(n_vals[c][cand]) for c in n_vals}
            for i in rows_in_order:
                _assign(i, med, filled, measured)
                match[i] = "median"
    for c in FILLED:
        v = filled[c]
        out[c] = pd.array([int(np.rint(x)) if np.isfinite(x) else pd.NA for x in v], dtype="Int64")
    for c in MEASURED:
        out[c] = measured[c]
    out["ncu_match"] = match
    out.attrs["ncu"] = {"matched_by_launch": match.count("launch"), "matched_by_median": match.count("median"),
                        "unmatched_kernels": n_kernels - match.count("launch") - match.count("median"),
                        "unused_ncu_rows": int((~used).sum())}
    return out


def _ncu_key(name: str) -> tuple[str, str]:
    """How an ncu name is looked up: in full, or as a bare function name (``--print-kernel-base
    function``) that matches table names with that base name."""
    full, short = full_name_key(name), short_name_key(name)
    return ("short", short) if full == short else ("full", full)


def _nanmedian(v: np.ndarray) -> float:
    finite = v[np.isfinite(v)]
    return float(np.median(finite)) if len(finite) else np.nan


def _assign(i: int, values: dict[str, float], filled: dict[str, np.ndarray], measured: dict[str, np.ndarray]) -> None:
    for c, arr in filled.items():
        if not np.isfinite(arr[i]) and np.isfinite(values[c]):
            arr[i] = values[c]
    for c, arr in measured.items():
        arr[i] = values[c]

