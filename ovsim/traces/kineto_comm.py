"""What a Kineto trace says about its collectives: each NCCL kernel's collective, algorithm,
protocol, dtype, group, sequence number and message size, from its own ``args`` or from the
``record_param_comms`` CPU op that launched it (:func:`collectives`), and the checks on JSON
values the reader (:mod:`ovsim.traces.kineto_file`) shares with it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ovsim.traces.table import DTYPE_BYTES, normalize_collective, normalize_dtype, parse_nccl_name

if TYPE_CHECKING:
    from ovsim.traces.kineto_file import _State

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _hashable(v: Any) -> Any:
    return v if v.__class__ in (int, str) else None


def _ints(values: tuple[Any, ...] | list[Any]) -> pd.arrays.IntegerArray:
    """Int64 with NA for anything that is not a JSON integer in range (bools, strings, floats, lists)."""
    n = len(values)
    types = set(map(type, values))
    if types <= {int}:
        try:
            return pd.arrays.IntegerArray(np.array(values, dtype=np.int64), np.zeros(n, dtype=bool))
        except OverflowError:
            pass
    clean = [v if v.__class__ is int and _I64_MIN <= v <= _I64_MAX else None for v in values]
    mask = np.fromiter((v is None for v in clean), dtype=bool, count=n)
    data = np.array([0 if v is None else v for v in clean], dtype=np.int64)
    return pd.arrays.IntegerArray(data, mask)


def _collectives(st: _State, names: tuple[str, ...], kinds: list[str], ext: tuple[Any, ...],
                 corr: list[int | None], comm: tuple[dict[str, Any] | None, ...]) -> dict[str, Any]:
    n = len(names)
    collective, algorithm, protocol, dtype, pg = [""] * n, [""] * n, [""] * n, [""] * n, [""] * n
    group: list[int | None] = [None] * n
    seq: list[int | None] = [None] * n
    message = np.full(n, np.nan)
    parsed: dict[str, Any] = {}
    threads = {k: sorted(v, key=lambda t: t[0]) for k, v in st.rpc_by_thread.items()}
    starts = {k: [t[0] for t in v] for k, v in threads.items()}
    for i in range(n):
        own = comm[i]
        if own is not None and normalize_collective(_str(own.get("Collective name"))):
            kinds[i] = "collective"
        if kinds[i] != "collective":
            continue
        nm = names[i]
        p = parsed.get(nm)
        if p is None:
            p = parsed[nm] = parse_nccl_name(nm)
        coll, dt = p.collective, p.dtype
        algorithm[i], protocol[i] = p.algorithm, p.protocol
        meta = own if own is not None else _linked_rpc(st, ext[i], corr[i], threads, starts)
        if meta is not None:
            coll = normalize_collective(_str(meta.get("Collective name"))) or coll
            dt = normalize_dtype(_str(meta.get("dtype"))) or dt
            gs = _int(meta.get("Group size"))
            group[i] = gs
            seq[i] = _int(meta.get("Seq"))
            name = meta.get("Process Group Name")
            pg[i] = name if isinstance(name, str) else str(name) if _int(name) is not None else ""
            message[i] = _message_bytes(coll, dt, gs, meta)
        collective[i], dtype[i] = coll, dt
    return {"collective": collective, "algorithm": algorithm, "protocol": protocol, "dtype": dtype,
            "message_bytes": message, "group_size": _ints(group), "process_group": pg, "seq": _ints(seq)}


def _linked_rpc(st: _State, ext: Any, corr: int | None, threads: dict[Any, list[tuple[float, float, dict[str, Any]]]],
                starts: dict[Any, list[float]]) -> dict[str, Any] | None:
    if ext.__class__ is int and ext in st.rpc_by_ext:
        return st.rpc_by_ext[ext]
    launch = st.launches.get(corr) if corr is not None else None
    if launch is None:
        return None
    ts, launch_ext, pid, tid = launch
    if launch_ext.__class__ is int and launch_ext in st.rpc_by_ext:
        return st.rpc_by_ext[launch_ext]
    key = (_hashable(pid), _hashable(tid))
    spans = threads.get(key)
    if not spans:
        return None
    j = _innermost(spans, starts[key], float(ts))
    return spans[j][2] if j is not None else None


def _innermost(spans: Sequence[tuple[Any, ...]], starts: list[float], ts: float,
               limit: int | None = None) -> int | None:
    """Index of the innermost span (start, end, ...) enclosing ``ts`` on one thread: the latest start
    at or before it whose end is not before it; ``limit`` bounds how many spans back to look."""
    j = bisect.bisect_right(starts, ts) - 1
    stop = -1 if limit is None else max(-1, j - limit)
    while j > stop:
        if spans[j][1] >= ts:
            return j
        j -= 1
    return None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _int(v: Any) -> int | None:
    return v if v.__class__ is int and _I64_MIN <= v <= _I64_MAX else None


def _nelems(v: Any) -> float | None:
    if v.__class__ in (int, float) and math.isfinite(v) and v >= 0:
        return float(v)
    return None


def _message_bytes(coll: str, dt: str, group: int | None, meta: dict[str, Any]) -> float:
    size = DTYPE_BYTES.get(dt)
    if size is None:
        return math.nan
    n_in = _nelems(meta.get("In msg nelems"))
    if n_in is None:
        n_out = _nelems(meta.get("Out msg nelems"))
        if n_out is None:
            return math.nan
        if coll == "all_gather":
            if not group:
                return math.nan
            n_in = n_out / group
        elif coll == "reduce_scatter":
            if not group:
                return math.nan
            n_in = n_out * group
        else:
            n_in = n_out
    return n_in * size
