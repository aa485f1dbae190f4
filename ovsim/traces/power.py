"""Measured GPU power: nvidia-smi and DCGM logs into one sample table, aligned to a timeline.

The canonical power-sample table (a pandas DataFrame, one row per GPU per sample, sorted by time
then GPU) has these columns:

================ =========================================================================
time_s           seconds from the log's first sample (add an offset to put it on a trace's clock)
gpu              GPU index (nvidia-smi ``index``, DCGM entity id); 0 when the log has no index
power_w          board power in watts (NaN where the tool printed N/A)
sm_clock_hz      SM clock in hertz, NaN when the log has no SM clock
wall_time_s      the sample's wall-clock time as seconds since 1970 when the log gives one (else NaN);
                 nvidia-smi prints local time without a zone, read here as if it were UTC: only
                 differences between samples, or against a clock read the same way, are meaningful
================ =========================================================================

Supported inputs (``format="auto"`` tells them apart by their header):

``nvidia-smi``
    ``nvidia-smi --query-gpu=timestamp,index,power.draw,clocks.sm --format=csv[,nounits] -lms 100``
    (or ``-l 1``). The header names the fields, with units in brackets (``power.draw [W]``,
    ``clocks.current.sm [MHz]``), values carry units (``208.36 W``, ``1545 MHz``) unless
    ``nounits``; ``[N/A]``/``[Not Supported]`` are missing values. Recognised fields:
    ``timestamp`` (``2024/05/01 12:00:00.123``), ``index`` (else ``pci.bus_id``/``uuid`` numbered by
    first appearance), ``power.draw`` / ``power.draw.average`` / ``power.draw.instant`` (the first
    present in that order), ``clocks.sm`` / ``clocks.current.sm`` (in MHz, or ``GHz``/``kHz``/``Hz``
    as the header or value says). ``--format=csv,noheader`` is refused: without the header the
    columns cannot be named. Without ``timestamp``, samples of each GPU are spaced ``interval_s``.
    Note that on recent drivers ``power.draw`` is a one-second average (``power.draw.instant`` is
    not); a cross-check against a prediction should average the prediction the same way.

``dcgmi dmon``
    ``dcgmi dmon -e 155,100 -d 100`` text output: a ``#Entity`` header naming fields by their short
    names (``POWER`` = field 155, watts; ``SMCLK`` = field 100, MHz; other fields are ignored), a
    units line (``ID W MHZ``), then ``GPU <id> <values...>`` rows; the header lines repeat every
    few dozen samples. dmon prints no timestamps (NVIDIA/DCGM#14), so sample ``n`` of a GPU is at
    ``n * interval_s`` (dmon's ``-d`` delay in seconds, default 1 s), unless every line starts with
    an epoch timestamp (as a ``ts``-style wrapper adds), which is then used. Rows of GPU instances
    (``GPU-I``/``GPU-CI``) are skipped and counted.

DCGM field CSV
    A CSV with a ``DCGM_FI_DEV_POWER_USAGE`` column (watts) and optionally ``DCGM_FI_DEV_SM_CLOCK``
    (MHz), a GPU column (``gpu``, ``gpu_id``, ``entity``, ``entityId``, ``device`` or ``index``) and
    a time column (``timestamp`` or ``time``: epoch seconds, epoch milliseconds or microseconds
    (told apart by magnitude), or ISO 8601): what a Prometheus/dcgm-exporter query exported to CSV
    or a DCGM-API logger writes. The Prometheus text exposition format itself (one scrape per file,
    no history) is not read.

Any of them may be gzip-compressed (told by its first bytes, whatever the file's name): long logs
at millisecond sampling compress about tenfold.

A last line cut short (a logger killed mid-write) is dropped and counted in ``attrs["skipped"]``;
any other malformed line, or a file with no power column, is a one-line :class:`OvsimError` naming
the file and the field.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import re
import zlib
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from ovsim.errors import OvsimError

SAMPLE_COLUMNS = ["time_s", "gpu", "power_w", "sm_clock_hz", "wall_time_s"]
PowerFormat = Literal["auto", "nvidia-smi", "dcgmi-dmon", "dcgm-csv"]
POWER_FORMATS: tuple[str, ...] = ("auto", "nvidia-smi", "dcgmi-dmon", "dcgm-csv")

_GZIP_MAGIC = b"\x1f\x8b"
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_MISSING = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "unknown error", "-", "nan",
            "[insufficient permissions]", "[gpu is lost]", "[requested functionality has been deprecated]"}
_HZ = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}
_W = {"w": 1.0, "mw": 1e-3, "kw": 1e3}
_SMI_POWER = ("power.draw", "power.draw.average", "power.draw.instant")
_SMI_CLOCK = ("clocks.sm", "clocks.current.sm")
_SMI_GPU = ("index", "pci.bus_id", "gpu_bus_id", "uuid", "gpu_uuid")
_DCGM_GPU = ("gpu", "gpu_id", "entity", "entityid", "entity_id", "device", "index")
_DCGM_TIME = ("timestamp", "time")


def read_power_samples(path: str | Path, format: PowerFormat = "auto", *,
                       interval_s: float = 1.0) -> pd.DataFrame:
    """Read a power log into the canonical sample table (see the module docstring).

    ``interval_s`` spaces samples when the log carries no timestamps (dcgmi dmon's ``-d`` delay,
    or nvidia-smi's ``-lms`` period when ``timestamp`` was not queried)."""
    p = Path(path)
    if not interval_s > 0:
        raise OvsimError(f"interval must be positive, got {interval_s}", source=str(p), field="interval_s")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise OvsimError("file not found", source=str(p)) from None
    except OSError as e:
        raise OvsimError(f"cannot read: {e.strerror}", source=str(p)) from None
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise OvsimError(f"gzip-compressed but cannot be decompressed ({e})", source=str(p)) from None
    text = data.decode(errors="replace")
    kind = _detect(text, p) if format == "auto" else format
    if kind == "nvidia-smi":
        return _nvidia_smi(text, str(p), interval_s)
    if kind == "dcgmi-dmon":
        return _dmon(text, str(p), interval_s)
    if kind == "dcgm-csv":
        return _dcgm_csv(text, str(p))
    raise OvsimError(f"unknown format '{format}'; expected one of {', '.join(POWER_FORMATS)}", source=str(p),
                     field="format")


def _detect(text: str, p: Path) -> str:
    for line in text.splitlines()[:50]:
        s = line.strip()
        if not s:
            continue
        low = s.lower()
        if "#entity" in low.replace(" ", ""):
            return "dcgmi-dmon"
        if "dcgm_fi_dev_power_usage" in low:
            return "dcgm-csv"
        if "power.draw" in low:
            return "nvidia-smi"
    raise OvsimError("not a power log ovsim knows: no nvidia-smi 'power.draw' header, dcgmi dmon '#Entity' "
                     "header or DCGM_FI_DEV_POWER_USAGE column in the first lines", source=str(p), field="format")


# -- helpers -----------------------------------------------------------------------------------------


def _finish(times_ns: list[int], gpus: list[int], power: list[float], clock: list[float], wall: list[float],
            source: str, skipped: dict[str, int]) -> pd.DataFrame:
    """``times_ns``: integer nanoseconds on any origin, so that differences stay exact (float
    seconds since 1970 keep only ~0.2 us)."""
    if not times_ns:
        raise OvsimError("no samples", source=source, field="power")
    t = np.asarray(times_ns, np.int64)
    df = pd.DataFrame({
        "time_s": (t - t.min()) / 1e9, "gpu": np.asarray(gpus, np.int64), "power_w": np.asarray(power, float),
        "sm_clock_hz": np.asarray(clock, float), "wall_time_s": np.asarray(wall, float),
    }, columns=SAMPLE_COLUMNS)
    if df["power_w"].isna().all():
        raise OvsimError("every power value is missing (N/A)", source=source, field="power")
    for column, field, unit in (("power_w", "power", "W"), ("sm_clock_hz", "sm_clock", "Hz")):
        negative = df[column] < 0
        if negative.any():
            raise OvsimError(f"negative value ({df[column][negative].iloc[0]:g} {unit} in {int(negative.sum())} "
                             "sample(s))", source=source, field=field)
    df = df.sort_values(["time_s", "gpu"], kind="stable").reset_index(drop=True)
    df.attrs["source"] = source
    df.attrs["skipped"] = dict(skipped)
    return df


def _number(raw: str, units: dict[str, float], default_unit: str, source: str, field: str, line: int) -> float:
    """A value such as ``208.36 W``, ``208.36``, ``1410 MHz`` or ``[N/A]`` in SI units (NaN if missing)."""
    s = raw.strip()
    if s.lower() in _MISSING:
        return math.nan
    m = re.fullmatch(r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z]*)", s)
    if m is None:
        raise OvsimError(f"line {line}: cannot read '{s}' as a number", source=source, field=field)
    unit = (m.group(2) or default_unit).lower()
    if unit not in units:
        raise OvsimError(f"line {line}: unknown unit '{m.group(2)}' in '{s}'", source=source, field=field)
    value = float(m.group(1)) * units[unit]
    if not math.isfinite(value):
        raise OvsimError(f"line {line}: '{s}' is not a finite number", source=source, field=field)
    return value


_EPOCH_DT = datetime(1970, 1, 1, tzinfo=UTC)


def _ns(dt: datetime) -> int:
    return (dt - _EPOCH_DT) // timedelta(microseconds=1) * 1000


def _smi_time(raw: str, source: str, line: int) -> int:
    """Nanoseconds since 1970 of an nvidia-smi timestamp (local time, read as UTC)."""
    s = raw.strip()
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S"):
        try:
            return _ns(datetime.strptime(s, fmt).replace(tzinfo=UTC))
        except ValueError:
            continue
    raise OvsimError(f"line {line}: cannot read '{s}' as a time (expected 2024/05/01 12:00:00.123)", source=source,
                     field="timestamp")


def _header_name(h: str) -> tuple[str, str]:
    """``' power.draw [W]'`` -> (``'power.draw'``, ``'w'``)."""
    m = re.fullmatch(r"\s*([^\[]*?)\s*(?:\[([^\]]*)\])?\s*", h)
    assert m is not None
    return m.group(1).strip().lower(), (m.group(2) or "").strip().lower()


class _Indexer:
    """Numbers GPU identifiers (bus ids, UUIDs) by first appearance; passes integer indices through."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, raw: str, numeric: bool, source: str, field: str, line: int) -> int:
        s = raw.strip()
        if numeric:
            try:
                v = int(s)
            except ValueError:
                raise OvsimError(f"line {line}: cannot read '{s}' as a GPU index", source=source,
                                 field=field) from None
            if v < 0:
                raise OvsimError(f"line {line}: negative GPU index {v}", source=source, field=field)
            return v
        return self.ids.setdefault(s, len(self.ids))


# -- nvidia-smi ----------------------------------------------------------------------------------


def _nvidia_smi(text: str, source: str, interval_s: float) -> pd.DataFrame:
    lines = text.splitlines()
    header_i = next((i for i, ln in enumerate(lines) if "power.draw" in ln.lower()),
                    next((i for i, ln in enumerate(lines) if ln.strip()), None))
    if header_i is None:
        raise OvsimError("empty file", source=source, field="power.draw")
    header_line = lines[header_i]
    names = [_header_name(h) for h in next(csv.reader([header_line], skipinitialspace=True))]
    cols = [n for n, _ in names]

    def find(options: tuple[str, ...]) -> int | None:
        for o in options:
            if o in cols:
                return cols.index(o)
        return None

    i_pow = find(_SMI_POWER)
    if i_pow is None:
        raise OvsimError(f"no power.draw column (columns: {', '.join(cols)}); a file written with "
                         "--format=csv,noheader cannot be read: ovsim needs the header", source=source,
                         field="power.draw")
    i_clk = find(_SMI_CLOCK)
    i_time = find(("timestamp",))
    i_gpu = find(_SMI_GPU)
    gpu_numeric = i_gpu is not None and cols[i_gpu] == "index"
    pow_unit = names[i_pow][1] or "w"
    clk_unit = names[i_clk][1] if i_clk is not None and names[i_clk][1] else "mhz"
    times: list[int] = []
    gpus: list[int] = []
    power: list[float] = []
    clock: list[float] = []
    wall: list[float] = []
    counts: dict[int, int] = {}
    skipped: dict[str, int] = {}
    index = _Indexer()
    body = [(n + 1, ln) for n, ln in enumerate(lines) if n > header_i and ln.strip()]
    for pos, (lineno, ln) in enumerate(body):
        if ln.strip() == header_line.strip():
            continue  # a restarted logger appends its header again
        fields = next(csv.reader([ln], skipinitialspace=True))
        if len(fields) != len(cols):
            if pos == len(body) - 1 and len(fields) < len(cols):
                skipped["truncated last line"] = skipped.get("truncated last line", 0) + 1
                continue
            raise OvsimError(f"line {lineno}: {len(fields)} fields, the header has {len(cols)}", source=source,
                             field="csv")
        g = index(fields[i_gpu], gpu_numeric, source, cols[i_gpu], lineno) if i_gpu is not None else 0
        w = _number(fields[i_pow], _W, pow_unit, source, cols[i_pow], lineno)
        hz = _number(fields[i_clk], _HZ, clk_unit, source, cols[i_clk], lineno) if i_clk is not None else math.nan
        if i_time is not None:
            t = _smi_time(fields[i_time], source, lineno)
            wall.append(t / 1e9)
        else:
            n = counts.get(g, 0)
            counts[g] = n + 1
            t = round(n * interval_s * 1e9)
            wall.append(math.nan)
        times.append(t)
        gpus.append(g)
        power.append(w)
        clock.append(hz)
    return _finish(times, gpus, power, clock, wall, source, skipped)


# -- dcgmi dmon ----------------------------------------------------------------------------------

_EPOCH = re.compile(r"^\s*(\d{9,}(?:\.\d*)?)\s+(.*)$")


def _dmon(text: str, source: str, interval_s: float) -> pd.DataFrame:
    fields: list[str] | None = None
    times: list[int] = []
    gpus: list[int] = []
    power: list[float] = []
    clock: list[float] = []
    wall: list[float] = []
    counts: dict[int, int] = {}
    skipped: dict[str, int] = {}
    lines = [(n + 1, ln) for n, ln in enumerate(text.splitlines()) if ln.strip()]
    stamped: bool | None = None
    for pos, (lineno, raw) in enumerate(lines):
        m = _EPOCH.match(raw)
        has_stamp = m is not None
        if stamped is None:
            stamped = has_stamp
        elif has_stamp != stamped:
            raise OvsimError(f"line {lineno}: some lines start with a timestamp and some do not", source=source,
                             field="timestamp")
        stamp_ns = _decimal_ns(m.group(1), 10**9, source, lineno) if m is not None else 0
        ln = m.group(2) if m is not None else raw
        tokens = ln.split()
        head = tokens[0].lower()
        if head.startswith("#"):
            names = [t for t in tokens if t != "#"]
            names[0] = names[0].lstrip("#")
            fields = [n.upper() for n in names[1:]]  # after "Entity"
            continue
        if head in ("id", "#id"):
            continue  # the units line
        if fields is None:
            raise OvsimError(f"line {lineno}: data before the '#Entity' header", source=source, field="header")
        entity = tokens[0].upper()
        if entity != "GPU":
            skipped[f"{entity} rows"] = skipped.get(f"{entity} rows", 0) + 1
            continue
        values = tokens[2:]
        if len(tokens) < 2 or len(values) != len(fields):
            if pos == len(lines) - 1:
                skipped["truncated last line"] = skipped.get("truncated last line", 0) + 1
                continue
            raise OvsimError(f"line {lineno}: {len(values)} values for {len(fields)} fields", source=source,
                             field="dmon")
        try:
            g = int(tokens[1])
        except ValueError:
            raise OvsimError(f"line {lineno}: cannot read '{tokens[1]}' as a GPU id", source=source,
                             field="entity") from None
        if "POWER" not in fields:
            raise OvsimError(f"no POWER field (field 155) in the header (fields: {', '.join(fields)})",
                             source=source, field="POWER")
        w = _number(values[fields.index("POWER")], _W, "w", source, "POWER", lineno)
        hz = (_number(values[fields.index("SMCLK")], _HZ, "mhz", source, "SMCLK", lineno)
              if "SMCLK" in fields else math.nan)
        if stamped:
            t = stamp_ns
        else:
            n = counts.get(g, 0)
            counts[g] = n + 1
            t = round(n * interval_s * 1e9)
        times.append(t)
        wall.append(stamp_ns / 1e9 if stamped else math.nan)
        gpus.append(g)
        power.append(w)
        clock.append(hz)
    if fields is None:
        raise OvsimError("no '#Entity' header line", source=source, field="header")
    return _finish(times, gpus, power, clock, wall, source, skipped)


# -- DCGM field CSV --------------------------------------------------------------------------------


def _decimal_ns(s: str, unit_ns: int, source: str, line: int) -> int:
    try:
        v = Decimal(s)
    except InvalidOperation:
        raise OvsimError(f"line {line}: cannot read '{s}' as a time", source=source, field="timestamp") from None
    if not v.is_finite():
        raise OvsimError(f"line {line}: cannot read '{s}' as a time", source=source, field="timestamp")
    return _in_range_ns(int(v * unit_ns), s, source, line)


def _in_range_ns(ns: int, raw: str, source: str, line: int) -> int:
    # Times are held as int64 nanoseconds: 1677 to 2262.
    if not _I64_MIN <= ns <= _I64_MAX:
        raise OvsimError(f"line {line}: '{raw}' is not a time between 1677 and 2262", source=source,
                         field="timestamp")
    return ns


def _epoch_ns(raw: str, source: str, line: int) -> int:
    """Nanoseconds since 1970 of epoch seconds, milliseconds, microseconds or nanoseconds (told
    apart by magnitude: any time after 1973), or of an ISO 8601 time (UTC if it has no zone)."""
    s = raw.strip()
    try:
        v = Decimal(s)
    except InvalidOperation:
        try:
            dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
        except ValueError:
            raise OvsimError(f"line {line}: cannot read '{s}' as a time (epoch seconds or ISO 8601)",
                             source=source, field="timestamp") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return _ns(dt)
    if not v.is_finite():
        raise OvsimError(f"line {line}: cannot read '{s}' as a time", source=source, field="timestamp")
    scale = 1 if v > 10**17 else 1000 if v > 10**14 else 10**6 if v > 10**11 else 10**9
    return _in_range_ns(int(v * scale), s, source, line)


def _dcgm_csv(text: str, source: str) -> pd.DataFrame:
    parsed = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    rows = [(n + 1, r) for n, r in enumerate(parsed) if r and any(c.strip() for c in r)]
    hdr_pos = next((i for i, (_, r) in enumerate(rows) if any(c.strip().upper() == "DCGM_FI_DEV_POWER_USAGE"
                                                              for c in r)), None)
    if hdr_pos is None:
        raise OvsimError("no DCGM_FI_DEV_POWER_USAGE column", source=source, field="DCGM_FI_DEV_POWER_USAGE")
    cols = [c.strip() for c in rows[hdr_pos][1]]
    low = [c.lower() for c in cols]
    i_pow = [c.upper() for c in cols].index("DCGM_FI_DEV_POWER_USAGE")
    i_clk = [c.upper() for c in cols].index("DCGM_FI_DEV_SM_CLOCK") if "dcgm_fi_dev_sm_clock" in low else None
    i_gpu = next((low.index(c) for c in _DCGM_GPU if c in low), None)
    i_time = next((low.index(c) for c in _DCGM_TIME if c in low), None)
    if i_time is None:
        raise OvsimError(f"no time column (one of {', '.join(_DCGM_TIME)}; columns: {', '.join(cols)})",
                         source=source, field="timestamp")
    times: list[int] = []
    gpus: list[int] = []
    power: list[float] = []
    clock: list[float] = []
    skipped: dict[str, int] = {}
    index = _Indexer()
    body = rows[hdr_pos + 1:]
    for pos, (lineno, r) in enumerate(body):
        if len(r) != len(cols):
            if pos == len(body) - 1 and len(r) < len(cols):
                skipped["truncated last line"] = skipped.get("truncated last line", 0) + 1
                continue
            raise OvsimError(f"line {lineno}: {len(r)} fields, the header has {len(cols)}", source=source, field="csv")
        g = 0
        if i_gpu is not None:
            gid = r[i_gpu].strip()
            g = index(gid, gid.isdigit(), source, cols[i_gpu], lineno)
        times.append(_epoch_ns(r[i_time], source, lineno))
        gpus.append(g)
        power.append(_number(r[i_pow], _W, "w", source, cols[i_pow], lineno))
        clock.append(_number(r[i_clk], _HZ, "mhz", source, cols[i_clk], lineno) if i_clk is not None else math.nan)
    wall = [t / 1e9 for t in times]
    return _finish(times, gpus, power, clock, wall, source, skipped)


# -- alignment -------------------------------------------------------------------------------------


def align_samples(samples: pd.DataFrame, offset_s: float = 0.0, *, start_s: float | None = None,
                  end_s: float | None = None, gpu_to_rank: dict[int, int] | None = None) -> pd.DataFrame:
    """Samples on a trace's clock: ``time_s + offset_s``, kept within [start_s, end_s] when given,
    with a ``rank`` column (the GPU index unless ``gpu_to_rank`` maps it; unmapped GPUs are dropped).

    The offset is the trace time of the log's first sample. With wall clocks on both sides,
    :func:`offset_from_wall_clock` computes it."""
    out = samples.copy()
    out["time_s"] = out["time_s"] + offset_s
    if gpu_to_rank is None:
        out["rank"] = out["gpu"]
    else:
        out["rank"] = out["gpu"].map(gpu_to_rank)
        out = out[out["rank"].notna()]
        out["rank"] = out["rank"].astype(np.int64)
    if start_s is not None:
        out = out[out["time_s"] >= start_s]
    if end_s is not None:
        out = out[out["time_s"] <= end_s]
    return out.reset_index(drop=True)


def offset_from_wall_clock(samples: pd.DataFrame, trace_start_wall_s: float) -> float:
    """The offset that puts the samples on a trace whose time zero was at ``trace_start_wall_s``
    (seconds since 1970, read the same way as the log's clock)."""
    wall = samples["wall_time_s"].to_numpy(float)
    t = samples["time_s"].to_numpy(float)
    ok = np.isfinite(wall)
    if not ok.any():
        raise OvsimError("the samples carry no wall-clock times", source=str(samples.attrs.get("source", "")),
                         field="timestamp")
    first_wall = float((wall[ok] - t[ok]).min())  # wall time of time_s == 0
    return first_wall - trace_start_wall_s


def predicted_at(samples: pd.DataFrame, timeline_counters: pd.DataFrame, counter: str = "power_w",
                 window_s: float = 0.0) -> np.ndarray:
    """The predicted ``counter`` at each aligned sample (needs ``rank`` and ``time_s``), or, with
    ``window_s`` > 0, its mean over the ``window_s`` before each sample (as a sensor that averages
    reports). NaN where the timeline has no value for the rank."""
    out = np.full(len(samples), np.nan)
    c = timeline_counters[timeline_counters["counter"] == counter]
    for r in np.unique(samples["rank"].to_numpy()):
        mine = c[c["rank"] == r].sort_values("time_s", kind="stable")
        if mine.empty:
            continue
        t = mine["time_s"].to_numpy(float)
        v = mine["value"].to_numpy(float)
        # Of samples at one instant the last holds.
        keep = np.append(t[1:] != t[:-1], True)
        t, v = t[keep], v[keep]
        energy = np.concatenate(([0.0], np.cumsum(v[:-1] * np.diff(t))))

        def integral(x: np.ndarray, t: np.ndarray = t, v: np.ndarray = v, energy: np.ndarray = energy) -> np.ndarray:
            i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(t) - 1)
            return np.asarray(energy[i] + v[i] * (x - t[i]))

        sel = (samples["rank"] == r).to_numpy()
        x = samples["time_s"].to_numpy(float)[sel]
        if window_s > 0:
            val = (integral(x) - integral(x - window_s)) / window_s
        else:
            i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(t) - 1)
            val = v[i]
        val = np.where(x - (window_s if window_s > 0 else 0.0) >= t[0], val, np.nan)
        out[sel] = val
    return out


def fit_table(aligned: pd.DataFrame, timeline_counters: pd.DataFrame, *, window_s: float = 0.0,
              measured_clock: bool = True) -> pd.DataFrame:
    """Measured power next to the predicted activity behind it, for
    :func:`ovsim.hw.power.fit_power`: one row per aligned sample (from :func:`align_samples`) with
    the columns of ``FIT_COLUMNS``. Activity comes from a prediction with counters on (``predict``'s
    default); ``window_s`` averages it like the sensor averages power. The SM clock is the measured
    one where the log has it (``measured_clock``), else the predicted one."""
    from ovsim.hw.power import FIT_COLUMNS

    out = pd.DataFrame({"power_w": aligned["power_w"].to_numpy(float)})
    for col in FIT_COLUMNS[1:]:
        out[col] = predicted_at(aligned, timeline_counters, col, window_s)
    if measured_clock and aligned["sm_clock_hz"].notna().any():
        meas = aligned["sm_clock_hz"].to_numpy(float)
        out["sm_clock_hz"] = np.where(np.isfinite(meas), meas, out["sm_clock_hz"].to_numpy(float))
    return out[list(FIT_COLUMNS)]
